"""SFT data: local dataset files -> conversations -> token ids with a loss mask -> per-step trainer batches.

Layouts (a row may use either; ``messages`` wins when a row has both):

- prompt / completion: ``prompt`` is a string (one user message) or a list of messages, ``completion`` a string
  (one assistant message) or a list of messages; the conversation is prompt then completion.
- messages: one list of ``{"role", "content"}`` messages (roles system, user, assistant, tool).

Optional columns: ``message_loss_mask`` (one 0/1 or bool per message of the whole conversation; 0 removes that
message from the loss, 1 keeps the role rule of ``[loss_mask]``), ``tools`` (OpenAI function schemas, a list or
a JSON string of one, given to the chat template), ``id`` (recorded per step). ``[data.columns]`` renames them.

Tokenization goes through the same renderer as the RL orchestrator (:mod:`toolkit.models.renderer`), message by
message: the ids of message ``i`` are what rendering ``messages[:i + 1]`` adds to ``messages[:i]``, so a sample's
ids are exactly the ids of the whole conversation, and an assistant turn's prompt is exactly the prompt RL
sampling would send. An assistant message's trainable tokens are its content and its end-of-turn token (the
template's generation prompt before it and anything after the end-of-turn token are not trained: RL never
samples them). Other roles are trained whole when ``[loss_mask]`` enables them.

Order: epoch ``e`` visits the rows in a permutation drawn from ``(seed, e)`` (or in file order without shuffle);
step ``n`` (1-based) takes samples ``(n - 1) * batch_size`` to ``n * batch_size - 1`` of the endless sequence of
epochs. The data position is therefore a function of the step alone: a resumed run trains on exactly the samples
an uninterrupted run would, with no data state in the checkpoint.

File checks (:func:`check_dataset`) use the standard library and pyarrow only, so the login node reports a bad
row before anything is submitted; :class:`SFTData` needs transformers (through the renderer) and runs in the
trainer, which fails before step 1 on a row the tokenizer reveals as bad (longer than ``seq_len``).
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROLES = ("system", "user", "assistant", "tool")
_SUFFIXES = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}
_COMPRESSED = (".gz", ".bz2", ".xz", ".zst", ".zip", ".lz4")
# A JSON escape of a UTF-16 surrogate (a pair spells an emoji; a lone one is no character at all).
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


class DataError(ValueError):
    """A dataset problem, naming the file, the row (0-based, within that file) and the column."""


def dataset_files(path: Path) -> list[Path]:
    """The data files of a dataset path: the file itself, or every ``*.jsonl``/``*.json``/``*.parquet`` file of a
    directory (sorted, one kind only). Raises DataError when there is none, or the kinds are mixed."""
    path = Path(path)
    if path.is_file():
        files = [path]
    elif path.is_dir():
        try:
            listed = sorted(path.iterdir())
        except OSError as e:
            raise DataError(
                f"{path}: the directory cannot be listed ({e.strerror or e}); check its permissions"
            ) from None
        for p in listed:
            if p.suffix.lower() in _SUFFIXES and not p.is_file():
                what = "a directory (give it as data.name itself)" if p.is_dir() else "a broken or looping symlink"
                raise DataError(f"{p}: named like a data file but is {what}; it would not be read")
        entries = [p for p in listed if p.is_file()]
        files = [p for p in entries if p.suffix in _SUFFIXES]
        # Files that look like data but would not be read: skipping them silently trains on part of the dataset.
        for p in entries:
            low = p.name.lower()
            if p.suffix not in _SUFFIXES and p.suffix.lower() in _SUFFIXES:
                raise DataError(
                    f"{p}: suffix {p.suffix!r} is not read (only lower-case .jsonl, .json, .parquet); "
                    "rename the file or move it out of the dataset directory"
                )
            if any(low.endswith(k + c) for k in _SUFFIXES for c in _COMPRESSED):
                raise DataError(
                    f"{p}: compressed data files are not read; decompress it or move it out of the dataset directory"
                )
    else:
        raise DataError(f"{path}: no such dataset file or directory (data.name must be a local path; no hub here)")
    if not files:
        raise DataError(f"{path}: no .jsonl, .json or .parquet files in this directory")
    bad = [p for p in files if p.suffix not in _SUFFIXES]
    if bad:
        raise DataError(f"{bad[0]}: unsupported file type {bad[0].suffix!r}; allowed: .jsonl, .json, .parquet")
    kinds = {_SUFFIXES[p.suffix] for p in files}
    if len(kinds) > 1:
        raise DataError(f"{path}: mixes JSON and Parquet files; keep one format per dataset")
    return files


class _DuplicateKey(Exception):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # Python keeps the last of two equal keys while Arrow refuses the row: the login check and the trainer
    # would disagree, so a duplicate key is an error here.
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(k)
        out[k] = v
    return out


def _check_encodable(value: Any, where: str) -> None:
    """Raise DataError when a string of ``value`` holds a lone surrogate (``\\ud800`` escaped in the JSON): valid
    JSON, but no UTF-8 text, so Arrow and the tokenizer refuse it."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise DataError(
            f"{where}: a string holds a lone UTF-16 surrogate escape (\\ud800-\\udfff without its "
            "pair), which is not text; fix or drop the row"
        ) from None


def _json_rows(path: Path) -> Iterator[tuple[int, Any]]:
    """(row, value) of a JSON Lines file (or a ``.json`` file holding one list of rows). Raises DataError on
    bytes that are not UTF-8 or a line that is not valid JSON, naming the row."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise DataError(f"{path}: cannot be read ({e.strerror or e}); check its permissions") from None
    if path.suffix == ".json" and raw.lstrip()[:1] == b"[":
        try:
            rows = json.loads(raw.decode("utf-8"), object_pairs_hook=_unique_keys)
        except UnicodeDecodeError as e:
            raise DataError(f"{path}: not UTF-8 text (byte {e.start})") from None
        except json.JSONDecodeError as e:
            raise DataError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
        except _DuplicateKey as e:
            raise DataError(f"{path}: an object has the key {e.args[0]!r} twice; keep one") from None
        escaped = _SURROGATE_ESCAPE.search(raw) is not None
        for row, value in enumerate(rows):
            if escaped:
                _check_encodable(value, f"{path}: row {row}")
            yield row, value
        return
    row = 0
    for lineno, line in enumerate(raw.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DataError(f"{path}: row {row} (line {lineno}): not UTF-8 text (byte {e.start} of the line)") from None
        try:
            value = json.loads(text, object_pairs_hook=_unique_keys)
        except json.JSONDecodeError as e:
            # A file that is one JSON document (an array, a pretty-printed object) fails on its first line: say so.
            hint = (
                "; the file looks like one JSON document, not one sample per line: write it as JSON Lines, or "
                "as one array in a .json file"
                if row == 0 and text.strip() in ("[", "{")
                else ""
            )
            raise DataError(f"{path}: row {row} (line {lineno}): not valid JSON ({e.msg}){hint}") from None
        except _DuplicateKey as e:
            raise DataError(
                f"{path}: row {row} (line {lineno}): the key {e.args[0]!r} appears twice in one object "
                "(readers disagree on which value wins); keep one"
            )
        if _SURROGATE_ESCAPE.search(line):
            _check_encodable(value, f"{path}: row {row} (line {lineno})")
        yield row, value
        row += 1


def _decodes(column: Any, i: int) -> bool:
    try:
        column[i].as_py()
    except UnicodeDecodeError:
        return False
    return True


def _file_rows(path: Path) -> Iterator[tuple[int, dict]]:
    """(row, dict) of one data file; Parquet through pyarrow. Raises DataError on unreadable files or rows."""
    if _SUFFIXES[path.suffix] == "parquet":
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except Exception as e:  # noqa: BLE001 - pyarrow raises many types for a damaged file
            raise DataError(f"{path}: not a readable Parquet file ({e})") from None
        try:
            rows = table.to_pylist()
        except UnicodeDecodeError:
            # Parquet writers need not validate UTF-8: find the cell to name it (this path only runs on bad data).
            row, column = next(
                ((i, c) for c in table.column_names for i in range(len(table)) if not _decodes(table[c], i)), ("?", "?")
            )
            raise DataError(
                f"{path}: row {row}, column {column!r}: a string holds bytes that are not UTF-8 text; "
                "fix the writer's encoding or drop the row"
            ) from None
        yield from enumerate(rows)
        return
    for row, value in _json_rows(path):
        if not isinstance(value, dict):
            raise DataError(f"{path}: row {row}: expected a JSON object (one sample), got {type(value).__name__}")
        yield row, value


@dataclass(frozen=True)
class Conversation:
    """One sample as the renderer sees it. ``message_mask`` has one bool per message, or is None."""

    messages: list[dict[str, Any]]
    message_mask: list[bool] | None
    tools: list[dict] | None
    sample_id: str


def _as_messages(value: Any, default_role: str, where: str, column: str) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"role": default_role, "content": value}]
    if not isinstance(value, list) or not value:
        raise DataError(
            f"{where}, column {column!r}: expected a string or a non-empty list of messages, got "
            f"{type(value).__name__ if value is not None else 'null'}"
        )
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            raise DataError(f"{where}, column {column!r}, message {i}: expected an object with role and content")
        m = {k: v for k, v in m.items() if v is not None}  # Arrow fills keys other rows have with nulls
        role, content = m.get("role"), m.get("content", "")
        if role not in ROLES:
            raise DataError(f"{where}, column {column!r}, message {i}: role {role!r} is not one of {', '.join(ROLES)}")
        if not isinstance(content, str):
            raise DataError(f"{where}, column {column!r}, message {i}: content must be a string")
        if role == "assistant" and "content" not in m and not m.get("tool_calls"):
            # A null reply would train the model to end its turn at once; it is missing data, not an answer.
            raise DataError(
                f"{where}, column {column!r}, message {i}: an assistant message without content (null "
                "or missing) and without tool_calls; fill it in or drop the row"
            )
        if "weight" in m:
            # OpenAI's fine-tuning format excludes a message from the loss with "weight": 0; ignoring the key
            # would train exactly the messages the data says not to.
            raise DataError(
                f"{where}, column {column!r}, message {i}: has a 'weight' key (OpenAI fine-tuning "
                "format), which srl does not read; move the weights to a message_loss_mask column "
                "(one 0/1 per message) and drop the key"
            )
        out.append({**m, "content": content})
    return out


def conversation(row: dict[str, Any], columns: Any, where: str, default_id: str) -> Conversation:
    """The conversation of one raw row (``columns``: the ``[data.columns]`` names). Raises DataError naming
    ``where`` (file and row) and the column for a missing column, a bad message, mask or tools value."""
    c = columns
    if row.get(c.messages) is not None:
        messages = _as_messages(row[c.messages], "user", where, c.messages)
    elif row.get(c.prompt) is not None and row.get(c.completion) is not None:
        messages = _as_messages(row[c.prompt], "user", where, c.prompt) + _as_messages(
            row[c.completion], "assistant", where, c.completion
        )
    else:
        have = sorted(k for k, v in row.items() if v is not None)
        raise DataError(
            f"{where}: needs a {c.messages!r} column, or both {c.prompt!r} and {c.completion!r} "
            f"(set [data.columns] when they have other names); the row has {have}"
        )
    mask = row.get(c.message_loss_mask)
    if mask is not None:
        if not isinstance(mask, list) or not all(isinstance(x, (bool, int)) and x in (0, 1) for x in mask):
            raise DataError(f"{where}, column {c.message_loss_mask!r}: expected a list of 0/1 or booleans")
        if len(mask) != len(messages):
            raise DataError(
                f"{where}, column {c.message_loss_mask!r}: {len(mask)} entries for {len(messages)} "
                "messages (one per message of the whole conversation)"
            )
        mask = [bool(x) for x in mask]
    tools = row.get(c.tools)
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError as e:
            raise DataError(f"{where}, column {c.tools!r}: not valid JSON ({e.msg})") from None
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise DataError(f"{where}, column {c.tools!r}: expected a list of function schemas (objects)")
    sid = row.get(c.id)
    return Conversation(messages, mask, tools or None, str(sid) if sid is not None else default_id)


def check_dataset(path: Path, columns: Any, loss_mask: Any = None) -> int:
    """Login-node check of a dataset path (files, UTF-8, JSON, columns, mask lengths). Returns the row count;
    raises DataError naming the file, row and column of the first problem.

    With ``loss_mask`` (the ``[loss_mask]`` section), a row with no message of a trained role (after its
    ``message_loss_mask``) is an error too: the trainer would refuse it only after the job started.
    """
    count = 0
    for f in dataset_files(path):
        for row, value in _file_rows(f):
            where = f"{f}: row {row}"
            conv = conversation(value, columns, where, f"{f.name}:{row}")
            if loss_mask is not None and not any(_trained(conv, i, loss_mask) for i in range(len(conv.messages))):
                roles = [m["role"] for m in conv.messages]
                raise DataError(
                    f"{where}: no message is trained (roles {roles}; [loss_mask] trains "
                    f"{[r for r in ROLES if getattr(loss_mask, r)]}, after message_loss_mask); "
                    "a completion or assistant message is missing, or [data.columns] names the "
                    "wrong column"
                )
            count += 1
    if not count:
        raise DataError(f"{path}: the dataset has no rows")
    return count


def _trained(conv: Conversation, i: int, loss_mask: Any) -> bool:
    """Whether message ``i`` is in the loss: its role is enabled in ``[loss_mask]`` and its message mask keeps it."""
    return bool(getattr(loss_mask, conv.messages[i]["role"])) and (conv.message_mask is None or conv.message_mask[i])


def _load_arrow(file: Path) -> Any:
    """One data file as a memory-mapped Arrow table through the ``datasets`` library (local files only).

    Each file is its own table: files whose columns or column types differ (an extra column, a prompt that is a
    string in one file and messages in another) are a valid dataset, which one concatenated Arrow schema cannot
    hold. Raises DataError naming the file when ``datasets`` cannot read it.
    """
    import datasets

    builder = "parquet" if _SUFFIXES[file.suffix] == "parquet" else "json"
    datasets.disable_progress_bars()
    try:
        return datasets.load_dataset(builder, data_files=[str(file)], split="train")
    except Exception as e:  # noqa: BLE001 - datasets and pyarrow raise many types for an unreadable file
        cause = e.__cause__ or e.__context__ or e
        raise DataError(
            f"{file}: the datasets library cannot read this file ({type(cause).__name__}: "
            f"{str(cause)[:300]}); check the file, or convert it to JSON Lines"
        ) from None


# ------------------------------------------------------------------------------------------------------------
# Tokenization
# ------------------------------------------------------------------------------------------------------------
def _render(renderer: Any, messages: list[dict], gen: bool, tools: list[dict] | None) -> list[int]:
    return list(renderer.render(messages, add_generation_prompt=gen, **({"tools": tools} if tools else {})))


def _check_rendered(renderer: Any, conv: Conversation, where: str) -> None:
    """Raise DataError when the renderer drops the row's tools or an assistant message's ``tool_calls``.

    A chat template without tool support renders a tool-calling turn as its (often empty) content: training on
    it would teach the model to end the turn where the data calls a tool, and nothing would say so.
    """
    with_tools = conv.tools and _render(renderer, conv.messages, False, conv.tools)
    if with_tools and with_tools == _render(renderer, conv.messages, False, None):
        raise DataError(
            f"{where}: the row has tools, but renderer {renderer.name!r} (the model's chat template) "
            "ignores them; use a model or [renderer] whose template renders tools, or drop the tools "
            "column"
        )
    for i, m in enumerate(conv.messages):
        if m.get("tool_calls"):
            plain = {k: v for k, v in m.items() if k != "tool_calls"}
            upto, without = conv.messages[: i + 1], [*conv.messages[:i], plain]
            if _render(renderer, upto, False, conv.tools) == _render(renderer, without, False, conv.tools):
                raise DataError(
                    f"{where}, message {i}: renderer {renderer.name!r} (the model's chat template) "
                    "ignores the message's tool_calls, so the turn would train as its content alone; "
                    "use a model or [renderer] whose template renders tool calls"
                )


def tokenize(renderer: Any, conv: Conversation, loss_mask: Any, where: str) -> tuple[np.ndarray, np.ndarray]:
    """Token ids (int32 ``[T]``) and loss mask (bool ``[T]``) of a conversation.

    ``loss_mask``: the ``[loss_mask]`` section (bool per role). Raises DataError when the renderer does not
    extend the previous messages' ids (a template that rewrites history: its loss attribution is ambiguous),
    when tools are given to a renderer that cannot take them, or when no token is trained.
    """
    if conv.tools and "tools" not in inspect.signature(renderer.render).parameters:
        raise DataError(f"{where}: the row has tools but renderer {renderer.name!r} cannot render them")
    _check_rendered(renderer, conv, where)
    stops = set(renderer.stop_token_ids)
    ids: list[int] = []
    mask: list[bool] = []
    for i, m in enumerate(conv.messages):
        upto = _render(renderer, conv.messages[: i + 1], False, conv.tools)
        train_role = _trained(conv, i, loss_mask)
        head = _render(renderer, conv.messages[:i], True, conv.tools) if m["role"] == "assistant" else ids
        if upto[: len(head)] != head or head[: len(ids)] != ids:
            raise DataError(
                f"{where}, message {i}: the renderer's ids for the conversation up to this message do "
                "not extend those of the messages before it (the template rewrites earlier turns), "
                "so the loss cannot be attributed; use another renderer"
            )
        body = upto[len(head) :]
        mask += [False] * (len(head) - len(ids))  # the generation prompt opening an assistant turn
        if m["role"] == "assistant" and train_role:
            end = next((k + 1 for k, t in enumerate(body) if t in stops), len(body))
            mask += [True] * end + [False] * (len(body) - end)
        else:
            mask += [train_role] * len(body)
        ids = upto  # head + body: the check above makes upto extend head, and head extend ids
    if not ids:
        raise DataError(f"{where}: the conversation renders to no tokens")
    mask[0] = False  # the first token has no context to be predicted from
    if not any(mask):
        raise DataError(
            f"{where}: no token is trained (no message of a role enabled in [loss_mask], or all "
            "masked by message_loss_mask)"
        )
    return np.asarray(ids, np.int32), np.asarray(mask, bool)


@dataclass
class SFTData:
    """Tokenized samples of one dataset: ``offsets`` [N+1] into the flat ``input_ids`` / ``loss_mask`` [T]."""

    input_ids: np.ndarray
    loss_mask: np.ndarray
    offsets: np.ndarray
    sample_ids: list[str]
    source: str

    def __len__(self) -> int:
        return len(self.sample_ids)

    @property
    def num_tokens(self) -> int:
        return int(self.offsets[-1])

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    @classmethod
    def build(
        cls,
        convs: list[Conversation],
        renderer: Any,
        loss_mask: Any,
        *,
        seq_len: int,
        source: str,
        wheres: list[str] | None = None,
    ) -> SFTData:
        """Tokenize every conversation. Raises DataError (naming the row) for a sample longer than ``seq_len``
        tokens (it would have to be cut, which trains on a conversation the data does not hold) or any
        :func:`tokenize` error, before any step runs."""
        ids, masks, offsets = [], [], [0]
        for k, conv in enumerate(convs):
            where = wheres[k] if wheres else f"{source}: sample {conv.sample_id}"
            t, m = tokenize(renderer, conv, loss_mask, where)
            if len(t) > seq_len:
                raise DataError(
                    f"{where}: {len(t)} tokens > data.seq_len = {seq_len}; raise data.seq_len or drop "
                    "the sample (srl never truncates a sample)"
                )
            ids.append(t)
            masks.append(m)
            offsets.append(offsets[-1] + len(t))
        return cls(
            np.concatenate(ids),
            np.concatenate(masks),
            np.asarray(offsets, np.int64),
            [c.sample_id for c in convs],
            source,
        )

    def subset(self, rows: np.ndarray) -> SFTData:
        """The samples at ``rows`` (indices), in that order."""
        ids = [self.input_ids[self.offsets[r] : self.offsets[r + 1]] for r in rows]
        masks = [self.loss_mask[self.offsets[r] : self.offsets[r + 1]] for r in rows]
        offsets = np.concatenate([[0], np.cumsum([len(x) for x in ids])]).astype(np.int64)
        return SFTData(
            np.concatenate(ids), np.concatenate(masks), offsets, [self.sample_ids[r] for r in rows], self.source
        )


def load_conversations(path: Path, columns: Any) -> tuple[list[Conversation], list[str]]:
    """Conversations of a dataset read through ``datasets`` (memory-mapped Arrow), with each row's location.

    JSON files are first checked line by line (:func:`check_dataset`), so a bad row is named instead of failing
    inside Arrow's schema inference. Raises DataError."""
    files = dataset_files(path)
    if _SUFFIXES[files[0].suffix] == "json":
        check_dataset(path, columns)
    convs, wheres = [], []
    for f in files:
        table = _load_arrow(f)
        rows = iter(table)
        for r in range(len(table)):
            where = f"{f}: row {r}"
            try:
                row = next(rows)
            except UnicodeDecodeError:
                raise DataError(
                    f"{where}: a string holds bytes that are not UTF-8 text; fix the writer's encoding or drop the row"
                ) from None
            convs.append(conversation(row, columns, where, f"{f.name}:{r}"))
            wheres.append(where)
    if not convs:
        raise DataError(f"{path}: the dataset has no rows")
    return convs, wheres


# ------------------------------------------------------------------------------------------------------------
# Order and batches
# ------------------------------------------------------------------------------------------------------------
def step_rows(n: int, *, batch_size: int, step: int, seed: int, shuffle: bool) -> tuple[np.ndarray, float]:
    """Rows of 1-based ``step`` and the epoch position after it (e.g. 1.5 = half-way through epoch 2).

    Step ``s`` takes positions ``(s - 1) * batch_size`` .. ``s * batch_size - 1`` of the endless epoch sequence;
    a step may span two epochs; epoch ``e`` (0-based) is a permutation drawn from ``(seed, e)``, or file order
    without ``shuffle``. Raises ValueError for ``n`` < 1 or ``step`` < 1.
    """
    if n < 1 or step < 1:
        raise ValueError(f"need at least one row and step >= 1 (n={n}, step={step})")
    start = (step - 1) * batch_size
    epochs, at = np.divmod(np.arange(start, start + batch_size, dtype=np.int64), n)
    rows = np.empty(batch_size, np.int64)
    for e in np.unique(epochs):
        order = np.random.default_rng([seed, int(e)]).permutation(n) if shuffle else np.arange(n)
        rows[epochs == e] = order[at[epochs == e]]
    return rows, (start + batch_size) / n


def to_batch(data: SFTData, rows: np.ndarray, step: int) -> Any:
    """A trainer :class:`toolkit.batches.Batch` holding ``rows`` of ``data`` with their loss mask as the CE mask
    (no RL tokens: ``loss_mask`` all False, zero advantages and logprobs)."""
    from toolkit.batches import Batch

    sub = data.subset(rows)
    t, s = sub.num_tokens, len(sub)
    return Batch(
        step=step,
        input_ids=sub.input_ids.astype(np.int32),
        loss_mask=np.zeros(t, bool),
        inference_logprobs=np.zeros(t, np.float32),
        advantages=np.zeros(t, np.float32),
        ce_mask=sub.loss_mask.copy(),
        ref_kl_mask=np.zeros(t, bool),
        ref_logprobs=np.zeros(t, np.float32),
        ref_topk_ids=np.zeros((t, 0), np.int32),
        ref_topk_logprobs=np.zeros((t, 0), np.float32),
        offsets=sub.offsets,
        prompt_lens=np.zeros(s, np.int32),
        policy_version=np.full(s, step - 1, np.int64),
        envs=["sft"] * s,
        meta={"sft": True},
    )
