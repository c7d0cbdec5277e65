"""On-policy distillation's model calls: the logprobs a teacher gives the policy's own sampled tokens.

The teacher is a vLLM server (``orchestrator.train.algo.teacher``): vLLM returns prompt logprobs, which is what
scoring needs. Each training sample's exact token ids (prompt + completion) are sent as the prompt of one
``/v1/completions`` request with ``prompt_logprobs = 0`` and ``max_tokens = 1``: the teacher prefills the sequence
and answers, for every position, the logprob of the token that stands there. Nothing is decoded or re-tokenized,
so the teacher scores exactly the tokens the policy sampled; that only means something when both models share a
tokenizer, which :meth:`TeacherScorer.check_tokenizer` verifies when the run starts (vLLM's ``/tokenize`` of the
same probe texts on the teacher and on the policy's engine).

Self-distillation (``opsd``, :class:`SelfDistillation`) needs no teacher of its own: the policy's engines score the
sample after a system message that shows the task's demonstration, which the policy did not see while sampling.

Scoring runs as each group finishes (the producer awaits it before queueing the group), with at most
``teacher.max_concurrent`` requests in flight. Samples are batched: each request carries every sample waiting to be
scored when a request slot frees up (vLLM takes a list of token-id prompts in one ``/v1/completions`` call and
answers one choice per prompt), up to ``MAX_BATCH_SAMPLES`` samples or ``MAX_BATCH_TOKENS`` tokens. Nothing waits
for a batch to fill: a lone sample goes out at once when a slot is free, so batching only ever replaces waiting in
line. Transport errors and server errors are retried (three tries in all, with a pause); a teacher that still fails
raises :class:`TeacherError` naming it, which ends the run: training on unscored rollouts would silently change the
algorithm.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Sequence
from typing import Any

import httpx

from toolkit.run.types import Rollout, TrainingSample

log = logging.getLogger(__name__)

TRIES = 3
RETRY_PAUSE_S = 2.0
# Bounds of one batched scoring request: its answer holds (1 + top_k) logprob entries per token, so the token bound
# keeps one answer to some tens of MB at most.
MAX_BATCH_SAMPLES = 64
MAX_BATCH_TOKENS = 32768
# Texts both tokenizers must split into the same ids: words, digits, spacing, punctuation and non-ASCII letters.
TOKENIZER_PROBES = (
    "The quick brown fox jumps over the lazy dog.",
    "  leading spaces, tabs\tand\nnewlines; 12345 + 67890 = 80235",
    "Unicode: héllo wörld, naïve café, Ωμέγα, 数学, emoji 🙂 and symbols ∑∫√",
    "def f(x):\n    return {'k': [x, x**2]}  # code",
)


class TeacherError(RuntimeError):
    """The teacher could not score (unreachable, malformed answers) or does not match the policy (tokenizer); the
    message names the teacher and its URL."""


class TeacherScorer:
    """Scores training samples under one teacher: the model ``name`` served at ``base_url`` (``.../v1``), at most
    ``max_concurrent`` requests in flight, each within ``timeout_s`` seconds, with the API key held by the
    environment variable ``api_key_var`` (None: no key); ``top_k`` > 0 also asks for the teacher's top tokens. Use
    from one event loop.

    ``label`` names the teacher in messages (``<env>: teacher <name> at <url>``). Counters since the last
    :meth:`drain_stats`: requests, their summed latency in seconds, tokens scored.
    """

    def __init__(
        self,
        name: str,
        base_url: str,
        *,
        max_concurrent: int,
        timeout_s: float,
        api_key_var: str | None = None,
        label: str = "",
        top_k: int = 0,
    ) -> None:
        self.timeout_s = timeout_s
        self.max_concurrent = max_concurrent
        self.api_key_var = api_key_var
        self.top_k = top_k
        self.name = name
        self.base_url = base_url.rstrip("/")
        # vLLM's /tokenize lives at the server root, beside /v1
        self.root_url = self.base_url.removesuffix("/v1")
        self.label = f"{label + ': ' if label else ''}teacher {name!r} at {self.base_url}"
        self._http: httpx.AsyncClient | None = None
        # samples waiting for a request slot: (token ids, the future of their answer's choice)
        self._waiting: list[tuple[list[int], asyncio.Future]] = []
        self._in_flight: set[asyncio.Task] = set()
        self.requests = 0
        self.latency_s = 0.0
        self.tokens = 0

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            headers = {}
            if self.api_key_var:
                key = os.environ.get(self.api_key_var, "")
                if not key:
                    raise TeacherError(f"{self.label}: environment variable {self.api_key_var} is not set")
                headers["Authorization"] = f"Bearer {key}"
            self._http = httpx.AsyncClient(
                timeout=self.timeout_s,
                headers=headers,
                limits=httpx.Limits(max_connections=self.max_concurrent),
            )
        return self._http

    async def aclose(self) -> None:
        """Close the HTTP client (idempotent); requests still in flight are cancelled."""
        for task in list(self._in_flight):
            task.cancel()
        await asyncio.gather(*self._in_flight, return_exceptions=True)
        http, self._http = self._http, None
        if http is not None:
            await http.aclose()

    async def _post(self, url: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST with retries; the JSON answer. Raises TeacherError after the last try or on a 4xx answer."""
        last = ""
        for attempt in range(TRIES):
            try:
                resp = await self._client().post(url, json=body)
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}"
            else:
                if resp.status_code < 400:
                    try:
                        return resp.json()
                    except ValueError:
                        last = f"answer is not JSON: {resp.text[:200]!r}"
                elif resp.status_code < 500:  # the request itself is wrong: another try gives the same answer
                    raise TeacherError(f"{self.label}: {url} answered HTTP {resp.status_code}: {resp.text[:500]}")
                else:
                    last = f"HTTP {resp.status_code}: {resp.text[:300]}"
            if attempt + 1 < TRIES:
                await asyncio.sleep(RETRY_PAUSE_S)
        raise TeacherError(f"{self.label}: {url} failed {TRIES} times; last: {last}")

    async def check_tokenizer(self, policy_root_url: str, policy_name: str) -> None:
        """Refuse a teacher whose tokenizer splits text differently from the policy's engine at
        ``policy_root_url`` (a vLLM server root, serving ``policy_name``). Raises TeacherError naming both
        models and the first probe text on which they differ."""
        policy_http = httpx.AsyncClient(timeout=self.timeout_s)
        try:
            for text in TOKENIZER_PROBES:
                body = {"prompt": text, "add_special_tokens": False}
                theirs = await self._post(f"{self.root_url}/tokenize", {**body, "model": self.name})
                try:
                    resp = await policy_http.post(f"{policy_root_url}/tokenize", json={**body, "model": policy_name})
                    resp.raise_for_status()
                    ours = resp.json()
                except (httpx.HTTPError, ValueError) as exc:
                    raise TeacherError(f"cannot tokenize on the policy's engine {policy_root_url}: {exc}") from exc
                if theirs.get("tokens") != ours.get("tokens"):
                    raise TeacherError(
                        f"{self.label} does not share the policy's tokenizer: the teacher (model {self.name!r}) "
                        f"splits {text!r} into {theirs.get('tokens')}, the policy (model {policy_name!r}) into "
                        f"{ours.get('tokens')}; distillation scores token ids, so both must use one tokenizer"
                    )
        finally:
            await policy_http.aclose()

    def model_name(self) -> str:
        """The model name scoring requests ask for."""
        return self.name

    async def score(self, sample: TrainingSample, prefix: Sequence[int] = ()) -> None:
        """Set ``sample.ref_logprobs``: the teacher's logprob of each completion token (nats; 0.0 where
        ``completion_mask`` is False), in the context ``prefix`` + prompt + the completion before it (``prefix``:
        privileged context the policy never saw, e.g. self-distillation's demonstration); with ``top_k`` = k also
        ``ref_topk_ids`` / ``ref_topk_logprobs``, the teacher's k most likely tokens at each completion position.
        Raises TeacherError."""
        ids = list(prefix) + list(sample.prompt_ids) + list(sample.completion_ids)
        answer = {"choices": [await self._choice(ids)]}
        got = prompt_token_logprobs(answer, ids)
        if got is None:
            raise TeacherError(f"{self.label}: the answer holds no prompt logprobs of the sent tokens (not vLLM?)")
        p = len(prefix) + len(sample.prompt_ids)
        mask = sample.completion_mask
        sample.ref_logprobs = [got[p + i] if m else 0.0 for i, m in enumerate(mask)]
        if self.top_k:
            top = prompt_top_logprobs(answer, self.top_k)
            if top is None:
                raise TeacherError(
                    f"{self.label}: the answer holds fewer than top_k={self.top_k} logprobs at a position"
                )
            blank = ([0] * self.top_k, [0.0] * self.top_k)
            rows = [top[p + i] if m else blank for i, m in enumerate(mask)]
            sample.ref_topk_ids = [r[0] for r in rows]
            sample.ref_topk_logprobs = [r[1] for r in rows]
        self.tokens += sum(1 for m in mask if m)

    async def _choice(self, ids: list[int]) -> dict[str, Any]:
        """The answer's choice for the prompt ``ids``, sent in the next batch (module doc). Raises TeacherError."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._waiting.append((ids, future))
        # on the next turn of the loop, so that the samples a group enqueues together go out together
        loop.call_soon(self._dispatch)
        return await future

    def _dispatch(self) -> None:
        """Send what waits, one batch per free request slot."""
        while self._waiting and len(self._in_flight) < self.max_concurrent:
            batch, tokens = [], 0
            while self._waiting and len(batch) < MAX_BATCH_SAMPLES:
                n = len(self._waiting[0][0])
                if batch and tokens + n > MAX_BATCH_TOKENS:
                    break
                batch.append(self._waiting.pop(0))
                tokens += n
            task = asyncio.create_task(self._send(batch))
            self._in_flight.add(task)
            task.add_done_callback(self._sent)

    def _sent(self, task: asyncio.Task) -> None:
        self._in_flight.discard(task)
        self._dispatch()

    async def _send(self, batch: list[tuple[list[int], asyncio.Future]]) -> None:
        """One ``/v1/completions`` request for every prompt of ``batch``; each future gets its prompt's choice, or
        the TeacherError of the request."""
        body = {
            "model": self.model_name(),
            "prompt": [ids for ids, _ in batch],
            "max_tokens": 1,
            "temperature": 1.0,
            "prompt_logprobs": self.top_k,
        }
        try:
            t0 = time.monotonic()
            answer = await self._post(f"{self.base_url}/completions", body)
            self.latency_s += time.monotonic() - t0
            self.requests += 1
            choices = answer.get("choices") if isinstance(answer, dict) else None
            if not isinstance(choices, list) or len(choices) != len(batch):
                raise TeacherError(
                    f"{self.label}: {len(batch)} prompts sent in one request, but the answer holds "
                    f"{len(choices) if isinstance(choices, list) else 'no'} choices (not vLLM?)"
                )
            # vLLM numbers the choices by prompt ("index"); the order of the list is not promised
            by_index = sorted(choices, key=lambda c: c.get("index", 0) if isinstance(c, dict) else 0)
            for (_, future), choice in zip(batch, by_index, strict=True):
                if not future.done():
                    future.set_result(choice)
        except asyncio.CancelledError:
            for _, future in batch:
                if not future.done():
                    future.set_exception(TeacherError(f"{self.label}: the scorer was closed"))
            raise
        except Exception as exc:  # noqa: BLE001 - every waiting sample must learn why, or its group waits forever
            err = exc if isinstance(exc, TeacherError) else TeacherError(f"{self.label}: {type(exc).__name__}: {exc}")
            for _, future in batch:
                if not future.done():
                    future.set_exception(err)

    async def prefix(self, rollout: Rollout) -> list[int]:
        """Token ids placed before a sample of ``rollout`` when it is scored (none for a teacher of its own)."""
        return []

    async def score_group(self, group: Sequence[Rollout]) -> None:
        """Set ``ref_logprobs`` on every sample of the group's valid rollouts (errored ones are never trained).
        Raises TeacherError."""
        jobs = []
        for r in group:
            if r.error_class is None:
                prefix = await self.prefix(r)
                jobs += [(s, prefix) for s in r.samples if s.completion_ids]
        await asyncio.gather(*(self.score(s, prefix) for s, prefix in jobs))

    def drain_stats(self) -> dict[str, float]:
        """``requests``, ``latency_s`` (mean seconds per request) and ``tokens`` since the last call."""
        out = {
            "requests": float(self.requests),
            "latency_s": self.latency_s / self.requests if self.requests else 0.0,
            "tokens": float(self.tokens),
        }
        self.requests, self.latency_s, self.tokens = 0, 0.0, 0
        return out


class SelfDistillation(TeacherScorer):
    """``opsd``: the policy is its own teacher, shown what it could not see while sampling. Each sample is scored
    by the policy's own engines (``client``: the orchestrator's ``PolicyClient``; its current model name, so a LoRA
    run scores with its adapter) after a system message that holds the task's demonstration (``algo.template`` with
    ``{demonstration}`` replaced by the task field ``algo.demo_key``, read from ``runtime``, the env's
    ``EnvRuntime``, and rendered with its renderer). The sampled tokens are scored verbatim after that block, so no
    text is re-tokenized (self-distillation fine-tuning, SDFT: arXiv 2601.19897). No second deployment;
    ``max_concurrent`` and ``timeout_s`` as for :class:`TeacherScorer`."""

    def __init__(
        self, algo: Any, *, client: Any, runtime: Any, max_concurrent: int, timeout_s: float, label: str = ""
    ) -> None:
        super().__init__(
            client.model,
            client.base_url + "/v1",
            max_concurrent=max_concurrent,
            timeout_s=timeout_s,
            label=label,
            top_k=algo.top_k,
        )
        self.label = f"{label + ': ' if label else ''}self-distillation on the policy's engines {self.base_url}"
        self.algo = algo
        self.client = client
        self.runtime = runtime

    def model_name(self) -> str:
        return self.client.model

    async def prefix(self, rollout: Rollout) -> list[int]:
        text = await self.runtime.demonstration(rollout.example_id, self.algo.demo_key)
        if text is None:
            raise TeacherError(
                f"{self.label}: task {rollout.task_id} of env {rollout.env} has no demonstration: its data has no "
                f"string field {self.algo.demo_key!r} (algo.demo_key)"
            )
        system = {"role": "system", "content": self.algo.template.replace("{demonstration}", text)}
        return list(self.runtime.renderer.render([system], add_generation_prompt=False))


def _positions(answer: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The per-position entries of a vLLM ``/v1/completions`` answer's ``prompt_logprobs`` after position 0 (which
    has no context and holds None): ``{token id: {"logprob", "rank", ...}}`` each. None when the answer has none or
    an entry is not a mapping."""
    try:
        per_position = answer["choices"][0]["prompt_logprobs"]
    except (KeyError, IndexError, TypeError):
        return None
    if not isinstance(per_position, list) or not per_position:
        return None
    entries = per_position[1:]
    return entries if all(isinstance(e, dict) for e in entries) else None


def prompt_token_logprobs(answer: dict[str, Any], ids: Sequence[int]) -> list[float] | None:
    """From a vLLM ``/v1/completions`` answer with ``prompt_logprobs``: the logprob of each token of ``ids`` at its
    position (index 0, which has no context, gets 0.0). None when the answer has no prompt logprobs, a different
    number of positions, or lacks the sent token at a position."""
    entries = _positions(answer)
    if entries is None or len(entries) != len(ids) - 1:
        return None
    out = [0.0]
    for tok, entry in zip(ids[1:], entries, strict=True):
        item = entry.get(str(tok))
        if not isinstance(item, dict) or "logprob" not in item:
            return None
        out.append(float(item["logprob"]))
    return out


def prompt_top_logprobs(answer: dict[str, Any], k: int) -> list[tuple[list[int], list[float]]] | None:
    """From a vLLM ``/v1/completions`` answer with ``prompt_logprobs = k``: at each position, the ``k`` most likely
    token ids and their logprobs, most likely first (vLLM adds the sent token when it is not among them; that one is
    left out). Position 0 (no context) gets zeros. None when a position holds fewer than ``k`` ranked entries."""
    entries = _positions(answer)
    if entries is None:
        return None
    out: list[tuple[list[int], list[float]]] = [([0] * k, [0.0] * k)]
    for entry in entries:
        ranked = sorted(
            (int(v["rank"]), int(t), float(v["logprob"]))
            for t, v in entry.items()
            if isinstance(v, dict) and isinstance(v.get("rank"), int) and v["rank"] <= k
        )
        if len(ranked) < k:
            return None
        out.append(([t for _, t, _ in ranked[:k]], [lp for _, _, lp in ranked[:k]]))
    return out
