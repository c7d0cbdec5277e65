"""The rollout store: every rollout of a run in one HDF5 file (``<run>/store/rollouts.h5``).

Written by the orchestrator (train and periodic-eval rollouts) and by ``srl eval run``; read offline by reports and
``srl diagnose``. Columnar and chunked, so a report reads only the columns it needs: one million rows of a numeric
column is one contiguous read of 8 MB.

Layout (schema version 1)::

    /                       attrs: schema_version, num_rows (rows committed; written last in every append),
                            counts = [rows, samples, tokens, errors] after the last append (written just before
                            num_rows, trusted only while counts[0] == num_rows)
    /columns/<name>         one 1-D resizable dataset per rollout column (dataset names are URL-quoted column
                            names, so "reward/correct" is stored as "reward%2Fcorrect")
                            string columns are dictionary-encoded: int32 codes (-1 = None), attr categorical=1
    /categories/<name>      the vlen-string categories of a string column, in code order
    /errors/{row,message}   sparse: the error message of each errored rollout (row index into /columns)
    /samples/{row,token_start,prompt_len,num_tokens}
                            one entry per training sample (a rollout has several when a multi-turn trajectory was
                            split); token_start indexes /tokens
    /tokens/{ids,logprobs,mask}
                            flat ragged token arrays: prompt then completion tokens of each sample; logprobs are the
                            sampling logprobs (natural log, 0.0 on prompt and masked tokens), mask is 1 where the
                            policy sampled the token

Columns: step, kind, time (unix seconds of the append), env, task_id, example_id, group_id, reward, advantage,
prompt_len, completion_len (tokens), num_turns, truncated, truncation_reason, error_class, policy_version,
off_policy_age (steps), seat (the agent seat of a trace-path rollout: verifiers' ``agent.name``; empty for srl's
chat loop; a store written before the column existed gets it on its next append, empty for the rows before), plus
``reward/<component>``, ``timing/<name>`` (seconds) and ``metric/<name>`` for every named reward component, timing
and rollout metric ever seen (NaN in rows that lack it).

Crash and reader safety: the writer opens the file for each append and closes it afterwards, so between appends the
file is closed, consistent and readable by other processes (HDF5 holds an exclusive lock while a writer has it
open; readers retry for a few seconds). ``num_rows`` is updated last, so rows of an append that died midway are
ignored and overwritten by the next append. One writer per file (the orchestrator or the eval runner).

The file uses HDF5's default (oldest compatible) format on purpose: the newest format (superblock version 3) marks
the file "open for write" while a writer has it, and a writer killed mid-append (a preempted or SIGKILLed
orchestrator) leaves that mark set, after which HDF5 refuses every later open, even read-only, until ``h5clear -s``.
A store left like that by an older srl, or one damaged beyond opening, is set aside by the next writer (renamed
``rollouts.h5.unreadable-<UTC time>``, a warning names it) and a new store is started, so a resumed run goes on.

Cost per append does not grow with the store: where the samples, tokens and error messages of the committed rows
end is read from ``counts`` (not by searching the whole ``/samples/row`` and ``/errors/row``), and a writer keeps the
categories of its string columns in memory (re-read only when the file has categories it has not seen). Measured
with 512-rollout appends: ~55 ms at 50k rows either way; at 300k rows 127 ms before, flat after.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Sequence
from itertools import chain
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

import h5py
import numpy as np

# pandas is imported lazily: the writer runs inside the orchestrator, which does not need it.
if TYPE_CHECKING:
    from typing import Self

    import pandas as pd

    from toolkit.run.types import Rollout

SCHEMA_VERSION = 1

# Rows per chunk of a per-rollout column; tokens per chunk of the flat token arrays. An append rewrites the partly
# filled last chunk of every dataset (the file is reopened per append, so the chunk cache is cold): 8 Ki rows x
# 8 bytes = 64 KiB chunks keep that cheap, and a million-row column is still only 123 chunk reads.
ROW_CHUNK = 8192
TOKEN_CHUNK = 1 << 16

# Fixed columns: name -> numpy dtype, or "cat" for a dictionary-encoded string column. Order is the DataFrame order.
BASE_COLUMNS: dict[str, Any] = {
    "step": np.int64,
    "kind": "cat",
    "time": np.float64,
    "env": "cat",
    "task_id": "cat",
    "example_id": np.int64,
    "group_id": np.int64,
    "reward": np.float64,
    "advantage": np.float64,
    "prompt_len": np.int64,
    "completion_len": np.int64,
    "num_turns": np.int64,
    "truncated": np.bool_,
    "truncation_reason": "cat",
    "error_class": "cat",
    "policy_version": np.int64,
    "off_policy_age": np.int64,
    "seat": "cat",
}
# Base columns read straight from the Rollout attribute of the same name.
_ROLLOUT_NUMERIC = (
    "example_id",
    "group_id",
    "reward",
    "advantage",
    "prompt_len",
    "completion_len",
    "num_turns",
    "truncated",
)
_ROLLOUT_STRINGS = ("env", "truncation_reason", "error_class", "seat")
# Prefixes of the open-ended float columns, and the Rollout attribute each comes from.
DYNAMIC_PREFIXES = {"reward/": "reward_components", "timing/": "timings", "metric/": "metrics"}
TOKEN_COLUMNS = ("prompt_ids", "completion_ids", "completion_logprobs", "completion_mask")

_LOCK_RETRY_S = 10.0
# HDF5's refusal of a file whose superblock still says a writer has it open.
_STALE_WRITER = "consistency flags"

log = logging.getLogger(__name__)


def _ds_name(column: str) -> str:
    # HDF5 treats "/" as a group separator and "." specially; quoting keeps every column one dataset.
    return quote(column, safe="")


def _open(path: Path, mode: str) -> h5py.File:
    """Open with retries while another process holds the HDF5 file lock (a writer mid-append). Raises OSError at
    once for a damaged file, and one naming ``h5clear -s`` for a file a killed writer left marked open."""
    deadline = time.monotonic() + _LOCK_RETRY_S
    delay = 0.01
    while True:
        try:
            # best-effort locking: lock where the filesystem supports it, carry on where flock is not implemented
            # (some Lustre/NFS mounts fail every open with ENOSYS otherwise).
            # No libver="latest": see the module docstring (a killed writer must not leave the file unopenable).
            return h5py.File(path, mode, locking="best-effort")
        except (BlockingIOError, OSError) as exc:
            # HDF5 says "unable to lock file, errno = 11"; a bare "lock" would also match a truncated file's
            # "sblock->base_addr" and wait out the retries on a file that will never open.
            locked = "unable to lock" in str(exc).lower() or isinstance(exc, BlockingIOError)
            if _STALE_WRITER in str(exc):
                raise OSError(
                    f"{path}: the rollout store is still marked open by a writer that was killed mid-append (HDF5 "
                    f"refuses it: {exc}); `h5clear -s {path}` clears the mark, and the run's next writer sets the "
                    "file aside and starts a new store"
                ) from exc
            if not locked or time.monotonic() > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.5)


def _append(group: h5py.Group, name: str, start: int, values: np.ndarray) -> None:
    """Set 1-D dataset ``group/name`` to ``start + len(values)`` rows and write ``values`` from row ``start``.

    Through h5py's low-level API: an append touches some 35 datasets, and the high-level ``group[name]``,
    ``resize`` and slice assignment cost about 0.3 ms each in Python (tests/benchmarks/orchestrator_overhead.py).
    HDF5 converts ``values`` (numeric) to the dataset's type as the high-level write would. A sequence that is not
    an ndarray is converted by numpy to the dataset's type first, as ``ds[a:b] = values`` does (left to HDF5, a
    list of floats with NaN would be written as INT64_MIN into an integer column instead of raising ValueError).
    Raises ValueError when ``values`` is not 1-D: the low-level write reads ``len(values)`` elements from the
    buffer, so a 2-D array would be written flattened and a (n, 0) array would write memory past its end."""
    dsid = h5py.h5d.open(group.id, name.encode())
    if not isinstance(values, np.ndarray):
        values = np.asarray(values, dtype=dsid.dtype)
    n = len(values)
    if values.ndim != 1:
        raise ValueError(f"{name}: values of shape {values.shape} for a 1-D dataset")
    dsid.set_extent((start + n,))
    if n:
        fspace = dsid.get_space()
        fspace.select_hyperslab((start,), (n,))
        dsid.write(h5py.h5s.create_simple((n,)), fspace, np.ascontiguousarray(values))


def _row_dataset(group: h5py.Group, name: str, dtype: Any, length: int) -> h5py.Dataset:
    fill = np.nan if np.issubdtype(np.dtype(dtype), np.floating) else (-1 if dtype != np.bool_ else False)
    return group.create_dataset(
        name, shape=(length,), maxshape=(None,), dtype=dtype, chunks=(ROW_CHUNK,), fillvalue=fill
    )


def _add_missing_base_columns(f: h5py.File) -> None:
    """Create every base column the file lacks (a new store: all of them; a store written by an older srl: the
    columns added since, e.g. ``seat``), as long as the committed rows, filled with the missing value (NaN, -1,
    or no category), so a resumed run keeps appending to its store."""
    cols, cats = f["columns"], f["categories"]
    rows = int(f.attrs["num_rows"])
    for name, dtype in BASE_COLUMNS.items():
        key = _ds_name(name)
        if key in cols:
            continue
        if dtype == "cat":
            ds = _row_dataset(cols, key, np.int32, rows)
            ds.attrs["categorical"] = 1
            cats.create_dataset(key, shape=(0,), maxshape=(None,), dtype=h5py.string_dtype(), chunks=(1024,))
        else:
            _row_dataset(cols, key, dtype, rows)


def _unopenable(path: Path) -> bool:
    """True when ``path`` exists, this process may read and write it, and HDF5 still cannot open it read-only: a
    stale "open for write" mark or damage, which waiting or retrying will not fix (a held lock, a missing file or
    missing permissions are not this)."""
    if not path.is_file() or not os.access(path, os.R_OK | os.W_OK) or not os.access(path.parent, os.W_OK):
        return False
    try:
        _open(path, "r").close()
    except OSError as exc:
        return "unable to lock" not in str(exc).lower()
    return False


class RolloutStoreWriter:
    """Append rollouts to ``path`` (created with its parent directories if missing; an existing store is extended).

    Use as a context manager or call :meth:`close`; each :meth:`append` is durable on its own (the file is opened,
    written, flushed and closed), so a crash loses at most the append in progress. Raises ``ValueError`` if the file
    exists with another schema version, ``OSError`` on filesystem errors (e.g. ENOSPC). An existing file that HDF5
    cannot open at all is set aside and replaced by a new store (see the module docstring).
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            f = _open(self.path, "a")
        except OSError:
            if not _unopenable(self.path):
                raise
            aside = self.path.with_name(f"{self.path.name}.unreadable-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")
            os.replace(self.path, aside)
            log.warning(
                "rollout store %s could not be opened (left marked open by a killed writer, or damaged); kept as %s "
                "and a new store started: the rows before it are in that file (`h5clear -s` may make it readable)",
                self.path,
                aside,
            )
            f = _open(self.path, "a")
        with f:
            version = f.attrs.get("schema_version")
            if version is None:
                f.attrs["schema_version"] = SCHEMA_VERSION
                f.attrs["num_rows"] = 0
                f.attrs["counts"] = np.zeros(4, np.int64)
                self._create_layout(f)
            elif int(version) != SCHEMA_VERSION:
                raise ValueError(f"{self.path}: rollout store schema {version}, this srl writes {SCHEMA_VERSION}")
            else:  # a store this writer extends (a resumed run) may predate columns added since
                _add_missing_base_columns(f)
        self._closed = False
        # Per string column: its categories (name -> code) as last read or written by this writer.
        self._categories: dict[str, dict[str, int]] = {}

    @staticmethod
    def _create_layout(f: h5py.File) -> None:
        f.create_group("columns")
        f.create_group("categories")
        _add_missing_base_columns(f)
        err = f.create_group("errors")
        _row_dataset(err, "row", np.int64, 0)
        err.create_dataset("message", shape=(0,), maxshape=(None,), dtype=h5py.string_dtype(), chunks=(1024,))
        smp = f.create_group("samples")
        for name in ("row", "token_start", "prompt_len", "num_tokens"):
            _row_dataset(smp, name, np.int64, 0)
        tok = f.create_group("tokens")
        for name, dtype in (("ids", np.int32), ("logprobs", np.float32), ("mask", np.uint8)):
            tok.create_dataset(name, shape=(0,), maxshape=(None,), dtype=dtype, chunks=(TOKEN_CHUNK,))

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Mark the writer closed (the file is already closed between appends)."""
        self._closed = True

    def append(
        self,
        rollouts: Sequence[Rollout],
        *,
        step: int,
        kind: str = "train",
        off_policy_age: Sequence[int] | None = None,
    ) -> int:
        """Append ``rollouts`` as rows of training step ``step``; returns the number of rows in the store after it.

        ``kind`` is "train" or "eval" (any label is accepted). ``off_policy_age[i]`` is how many policy versions the
        policy that produced rollout i lagged behind ``step``; when omitted it is ``step - policy_version`` (the
        async bound of the orchestrator is on exactly this quantity). Raises ``ValueError`` if ``off_policy_age``
        has the wrong length, ``RuntimeError`` after :meth:`close`.
        """
        if self._closed:
            raise RuntimeError(f"{self.path}: append after close")
        n = len(rollouts)
        if off_policy_age is not None and len(off_policy_age) != n:
            raise ValueError(f"off_policy_age has {len(off_policy_age)} entries for {n} rollouts")
        if n == 0:
            return self.num_rows()
        now = time.time()
        policy_version = np.fromiter((r.policy_version for r in rollouts), np.int64, n)
        age = (
            np.asarray(off_policy_age, dtype=np.int64)
            if off_policy_age is not None
            else np.int64(step) - policy_version
        )
        numeric: dict[str, np.ndarray] = {
            c: np.fromiter((getattr(r, c) for r in rollouts), BASE_COLUMNS[c], n) for c in _ROLLOUT_NUMERIC
        }
        numeric.update(
            step=np.full(n, step, np.int64),
            time=np.full(n, now, np.float64),
            policy_version=policy_version,
            off_policy_age=age,
        )
        strings: dict[str, list[str | None]] = {c: [getattr(r, c) for r in rollouts] for c in _ROLLOUT_STRINGS}
        strings.update(kind=[kind] * n, task_id=[str(r.task_id) for r in rollouts])
        with _open(self.path, "a") as f:
            start = int(f.attrs["num_rows"])
            cols = f["columns"]
            for name, values in numeric.items():
                _append(cols, _ds_name(name), start, values)
            for name, values in strings.items():
                _append(cols, _ds_name(name), start, self._encode(f, name, values))
            self._append_dynamic(f, rollouts, start)
            s0, t0, e0 = _committed_ends(f, start)
            errors = self._append_errors(f, rollouts, start, e0)
            samples, tokens = self._append_tokens(f, rollouts, start, s0, t0)
            f.attrs["counts"] = np.array([start + n, samples, tokens, errors], np.int64)
            # Committed last: a reader or the next append trusts only rows below num_rows.
            f.attrs["num_rows"] = start + n
            f.flush()
        return start + n

    def num_rows(self) -> int:
        """Rows committed to the store."""
        with _open(self.path, "r") as f:
            return int(f.attrs["num_rows"])

    def _encode(self, f: h5py.File, name: str, values: list[str | None]) -> np.ndarray:
        cat_ds = f["categories"][_ds_name(name)]
        known = self._categories.get(name)
        if known is None or len(known) != cat_ds.shape[0]:  # first use, or categories written since (a died append)
            known = self._categories[name] = {c: i for i, c in enumerate(cat_ds.asstr()[:])}
        new: list[str] = []
        codes = np.empty(len(values), np.int32)
        for i, v in enumerate(values):
            if v is None:
                codes[i] = -1
                continue
            code = known.get(v)
            if code is None:
                code = known[v] = len(known)
                new.append(v)
            codes[i] = code
        if new:
            old = cat_ds.shape[0]
            cat_ds.resize((old + len(new),))
            cat_ds[old:] = np.array(new, dtype=object)
        return codes

    @staticmethod
    def _append_dynamic(f: h5py.File, rollouts: Sequence[Rollout], start: int) -> None:
        cols = f["columns"]
        n = len(rollouts)
        for prefix, attr in DYNAMIC_PREFIXES.items():
            names: dict[str, None] = {}
            for r in rollouts:
                names.update(dict.fromkeys(getattr(r, attr)))
            existing = {unquote(k) for k in cols if unquote(k).startswith(prefix)}
            for key in names:
                col = prefix + key
                if col not in existing:
                    # Rows written before this name appeared read back as NaN (the dataset's fill value).
                    _row_dataset(cols, _ds_name(col), np.float64, start)
                    existing.add(col)
            for col in existing:
                key = col[len(prefix) :]
                values = np.fromiter((getattr(r, attr).get(key, np.nan) for r in rollouts), np.float64, n)
                _append(cols, _ds_name(col), start, values)

    @staticmethod
    def _append_errors(f: h5py.File, rollouts: Sequence[Rollout], start: int, keep: int) -> int:
        """Write the error entries of rows ``start...`` after the first ``keep`` entries (those of committed rows;
        entries of an append that died before committing are overwritten); returns the entries now kept."""
        err = f["errors"]
        idx = [i for i, r in enumerate(rollouts) if r.error_class is not None or r.error_message]
        _append(err, "row", keep, np.asarray([start + i for i in idx], np.int64))
        msgs = err["message"]
        msgs.resize((keep + len(idx),))
        if idx:
            msgs[keep:] = np.array([rollouts[i].error_message or "" for i in idx], dtype=object)
        return keep + len(idx)

    @staticmethod
    def _append_tokens(f: h5py.File, rollouts: Sequence[Rollout], start: int, s0: int, t0: int) -> tuple[int, int]:
        """Write the samples of rows ``start...`` from sample ``s0`` and token ``t0`` on (where the committed rows'
        end); returns (samples, tokens) now in the store."""
        smp, tok = f["samples"], f["tokens"]
        rows, starts, plens, ntoks = [], [], [], []
        ids: list[Iterable[int]] = []
        lps: list[Iterable[float]] = []
        masks: list[Iterable[bool]] = []
        t = t0
        for i, r in enumerate(rollouts):
            for s in r.samples:
                npr, nco = len(s.prompt_ids), len(s.completion_ids)
                rows.append(start + i)
                starts.append(t)
                plens.append(npr)
                ntoks.append(npr + nco)
                t += npr + nco
                ids.append(s.prompt_ids)
                ids.append(s.completion_ids)
                lps.append([0.0] * npr)
                lps.append(s.completion_logprobs)
                masks.append([False] * npr)
                masks.append(s.completion_mask)
        for name, values in (
            ("row", rows),
            ("token_start", starts),
            ("prompt_len", plens),
            ("num_tokens", ntoks),
        ):
            _append(smp, name, s0, np.asarray(values, np.int64))
        total = t - t0
        _append(tok, "ids", t0, _flatten(ids, np.int32, total))
        _append(tok, "logprobs", t0, _flatten(lps, np.float32, total))
        _append(tok, "mask", t0, _flatten(masks, np.uint8, total))
        return s0 + len(rows), t


def _committed_ends(f: h5py.File, rows: int) -> tuple[int, int, int]:
    """(samples, tokens, error entries) that belong to the first ``rows`` rows: from the ``counts`` attribute when
    it describes exactly those rows, else (a store written before ``counts`` existed, or an append that died
    between the two attributes) by searching the row indices, which costs a read of both index datasets."""
    counts = f.attrs.get("counts")
    if counts is not None and len(counts) == 4 and int(counts[0]) == rows:
        return int(counts[1]), int(counts[2]), int(counts[3])
    smp = f["samples"]
    srow = smp["row"]
    s0 = int(np.searchsorted(srow[:], rows)) if srow.shape[0] else 0
    t0 = int(smp["token_start"][s0 - 1] + smp["num_tokens"][s0 - 1]) if s0 else 0
    erow = f["errors"]["row"]
    e0 = int(np.searchsorted(erow[:], rows)) if erow.shape[0] else 0
    return s0, t0, e0


def _flatten(parts: list[Iterable[Any]], dtype: Any, total: int) -> np.ndarray:
    # One fromiter over the chained lists: converting each short list with np.asarray costs ~1 us per call,
    # which dominated appends of many short samples.
    return np.fromiter(chain.from_iterable(parts), dtype=dtype, count=total)


# -- readers -----------------------------------------------------------------------------------------------------


def _column_names(f: h5py.File) -> list[str]:
    present = {unquote(k) for k in f["columns"]}
    base = [c for c in BASE_COLUMNS if c in present]
    return base + sorted(present - set(base)) + ["error_message"]


def load_rollouts(
    path: Path,
    columns: Sequence[str] | None = None,
    with_tokens: bool = False,
    *,
    kind: str | None = None,
) -> pd.DataFrame:
    """Read the store at ``path`` into a DataFrame, one row per rollout, in append order.

    ``columns`` selects columns (default: all per-rollout columns); reading fewer columns reads fewer bytes.
    String columns come back as pandas ``category`` (None as NaN); ``error_message`` is filled only for errored
    rollouts. ``kind`` keeps only rows of that kind ("train"/"eval"). With ``with_tokens`` four more columns hold,
    per rollout, a list (one entry per training sample) of numpy arrays: ``prompt_ids`` (int32),
    ``completion_ids`` (int32), ``completion_logprobs`` (float32, natural log) and ``completion_mask`` (bool).
    Raises ``FileNotFoundError`` if the store is missing and ``KeyError`` naming an unknown column.
    """
    import pandas as pd

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no rollout store at {path}")
    with _open(path, "r") as f:
        n = int(f.attrs["num_rows"])
        available = _column_names(f)
        wanted = list(available) if columns is None else list(columns)
        unknown = [c for c in wanted if c not in available]
        if unknown:
            raise KeyError(f"unknown store column(s) {unknown}; the store has {available}")
        extra = ["kind"] if kind is not None and "kind" not in wanted else []  # to filter on, dropped below
        data: dict[str, Any] = {}
        for col in wanted + extra:
            if col == "error_message":
                data[col] = pd.Series(_read_error_messages(f, n), dtype=object)
                continue
            ds = f["columns"][_ds_name(col)]
            values = ds[:n]
            if ds.attrs.get("categorical"):
                cats = list(f["categories"][_ds_name(col)].asstr()[:])
                data[col] = pd.Categorical.from_codes(values, categories=cats)
            else:
                data[col] = values
        if with_tokens:
            data.update(_read_tokens(f, n))
    df = pd.DataFrame(data)
    if kind is not None:
        df = df[df["kind"] == kind].drop(columns=extra).reset_index(drop=True)
    return df


def load_samples(path: Path, rows: Sequence[int]) -> dict[int, list[tuple[np.ndarray, np.ndarray, np.ndarray]]]:
    """The training samples of a few rollouts, read without loading the whole token arrays (a report shows a
    handful of rollouts from a store of millions).

    ``rows`` are row positions of :func:`load_rollouts` (append order, before any ``kind`` filter). Returns, per
    requested row that is committed, its samples in order as ``(prompt_ids, completion_ids, completion_mask)``
    (int32, int32, bool arrays); an errored rollout has none. Raises ``FileNotFoundError`` if the store is missing.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no rollout store at {path}")
    out: dict[int, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
    with _open(path, "r") as f:
        n = int(f.attrs["num_rows"])
        smp, tok = f["samples"], f["tokens"]
        sample_rows = smp["row"][:]  # sorted: samples are appended in row order
        for r in sorted({int(r) for r in rows if 0 <= int(r) < n}):
            lo, hi = np.searchsorted(sample_rows, r), np.searchsorted(sample_rows, r, side="right")
            out[r] = []
            for i in range(int(lo), int(hi)):
                s, p, k = int(smp["token_start"][i]), int(smp["prompt_len"][i]), int(smp["num_tokens"][i])
                ids, mask = tok["ids"][s : s + k], tok["mask"][s : s + k].astype(bool)
                out[r].append((ids[:p], ids[p:], mask[p:]))
    return out


def _read_error_messages(f: h5py.File, n: int) -> np.ndarray:
    out = np.full(n, None, dtype=object)
    rows = f["errors"]["row"][:]
    keep = rows < n
    if keep.any():
        msgs = f["errors"]["message"].asstr()[: len(rows)]
        out[rows[keep]] = np.asarray(msgs, dtype=object)[keep]
    return out


def _read_tokens(f: h5py.File, n: int) -> dict[str, list[list[np.ndarray]]]:
    smp, tok = f["samples"], f["tokens"]
    rows = smp["row"][:]
    m = int(np.searchsorted(rows, n))
    rows = rows[:m]
    starts, plens, ntoks = smp["token_start"][:m], smp["prompt_len"][:m], smp["num_tokens"][:m]
    end = int(starts[-1] + ntoks[-1]) if m else 0
    ids, lps, mask = tok["ids"][:end], tok["logprobs"][:end], tok["mask"][:end].astype(bool)
    out: dict[str, list[list[np.ndarray]]] = {c: [[] for _ in range(n)] for c in TOKEN_COLUMNS}
    for r, s, p, k in zip(rows.tolist(), starts.tolist(), plens.tolist(), ntoks.tolist()):
        out["prompt_ids"][r].append(ids[s : s + p])
        out["completion_ids"][r].append(ids[s + p : s + k])
        out["completion_logprobs"][r].append(lps[s + p : s + k])
        out["completion_mask"][r].append(mask[s + p : s + k])
    return out
