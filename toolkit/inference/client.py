"""The orchestrator's client of the policy: token ids in, token ids and sampling logprobs out.

Requests go to ``/v1/completions`` with the prompt as a list of token ids, so nothing is ever re-tokenised (a random
or byte-level model emits tokens that are not valid UTF-8; the RL path must stay on ids). Each rollout sends an
``X-Session-ID`` header: vllm-router's ``sticky_least_loaded`` policy keys on it (body fields are ignored by
vllm-router 0.1.17), so every turn of a multi-turn rollout lands on the replica that holds its KV cache.

Engine restarts (``inference.max_restarts``): the client has a *serving gate* that the orchestrator's engine watch
(``toolkit.orchestrator.engines``) closes while an engine is down or restarted without the current policy weights,
and opens once the newest STABLE weights are loaded. Requests wait at the gate instead of failing, and a response
to a request that was in flight when the gate closed is discarded and the request sent again (it may have been
answered by an engine that did not hold the policy the rollout is tagged with). With ``retry_budget_s`` set,
transient failures are retried for that long (covering an engine restart) instead of a fixed number of times.

A group's rollouts start together and ask for the same first prompt: unseeded calls for one prompt and sampling
made in the same pass of the event loop go out as one request of ``n`` samples (:meth:`PolicyClient.generate`).
Measured with tests/benchmarks/rl_loop.py on 2 cores, interleaved runs: the README job's RL step 0.24-0.33 s
against 0.41 s with one request per rollout.

The transport is aiohttp, not httpx: against a zero-latency server (``tests/benchmarks/orchestrator_overhead.py``)
httpx's pool fell from about 530 requests/s at 8 connections to 75 at 64, while aiohttp kept about 2,700 at 64
and 256. RL keeps hundreds of rollouts in flight, so the client must not slow down with concurrency.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import urllib.parse
import urllib.request
from typing import Any

import aiohttp

from toolkit.errors import ProviderError
from toolkit.inference.versions import ADAPTER_VERSION_HEADER, VERSION_HEADER, judge, split_header
from toolkit.run.types import Generation, SamplingParams

SESSION_HEADER = "X-Session-ID"

# Transport failures and HTTP statuses worth a retry: the engine or router is (re)starting, overloaded, or a
# replica died under the router. Other 4xx are request-dialect errors that a retry cannot fix.
_RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
_RETRY_EXC = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError)
# Longest pause between retries (seconds) when retrying for a time budget: short enough that a restarted engine is
# used within seconds of coming back, long enough not to flood a recovering one.
MAX_BACKOFF_S = 5.0


def completion_payload(model: str, prompt_ids: list[int], sampling: SamplingParams) -> dict[str, Any]:
    """Body of one ``/v1/completions`` request (vLLM dialect) for a token-id prompt.

    ``logprobs: 0`` returns only the sampled token's logprob (natural log). srl's engines run with
    ``--logprobs-mode processed_logprobs`` (``commands.ENGINE_DEFAULTS``), so it is the logprob under the
    temperature-scaled (and top-k/top-p filtered) distribution the token was drawn from; the trainer applies the
    same temperature.
    ``top_k`` None or 0 means none (vLLM's value for "off" is 0 or -1). ``skip_special_tokens`` is off so the text
    matches the token ids.
    """
    body: dict[str, Any] = {
        "model": model,
        "prompt": list(prompt_ids),
        "max_tokens": int(sampling.max_tokens),
        "temperature": float(sampling.temperature),
        "top_p": float(sampling.top_p),
        "top_k": int(sampling.top_k) if sampling.top_k else 0,
        "logprobs": 0,
        "return_token_ids": True,
        "skip_special_tokens": False,
    }
    if sampling.stop_token_ids:
        body["stop_token_ids"] = list(sampling.stop_token_ids)
    if sampling.seed is not None:
        body["seed"] = int(sampling.seed)
    return body


def parse_choices(data: dict[str, Any], n: int, policy_version: int) -> list[Generation]:
    """The ``n`` completions of one ``/v1/completions`` response asked for ``n`` samples, in choice-index order.

    Raises ProviderError when the response holds another number of choices (an endpoint that ignored ``n``) or a
    choice is malformed (:func:`parse_completion`).
    """
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or len(choices) != n:
        got = len(choices) if isinstance(choices, list) else "no"
        raise ProviderError(f"asked for {n} completions of one prompt, the response holds {got} choices")
    ordered = sorted(choices, key=lambda c: int(c.get("index", 0)) if isinstance(c, dict) else 0)
    return [parse_completion({"choices": [c]}, policy_version) for c in ordered]


def _sampling_key(prompt_ids: list[int], sampling: SamplingParams) -> tuple:
    return (
        tuple(prompt_ids),
        sampling.temperature,
        sampling.top_p,
        sampling.top_k,
        sampling.max_tokens,
        tuple(sampling.stop_token_ids),
    )


class _Coalesced:
    """Requests for the same prompt and sampling made in one pass of the event loop, sent as one request of ``n``
    samples by ``task`` (its Generations in join order)."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.n = 0
        self.waiting = 0
        self.task: asyncio.Task[list[Generation]] | None = None


def parse_completion(data: dict[str, Any], policy_version: int) -> Generation:
    """Turn a ``/v1/completions`` response with ``return_token_ids`` into a Generation.

    Raises ProviderError when the response lacks token ids or logprobs, or their lengths differ (an engine that
    ignored ``return_token_ids``, e.g. not vLLM).
    """
    try:
        choice = data["choices"][0]
        token_ids = [int(t) for t in choice["token_ids"]]
        logprobs = [float(x) for x in choice["logprobs"]["token_logprobs"]]
    except (KeyError, IndexError, TypeError) as exc:
        raise ProviderError(f"completion response without token ids/logprobs: {str(data)[:300]}") from exc
    if len(token_ids) != len(logprobs):
        raise ProviderError(f"{len(token_ids)} token ids but {len(logprobs)} logprobs in completion response")
    return Generation(
        token_ids=token_ids,
        logprobs=logprobs,
        finish_reason=str(choice.get("finish_reason") or "length"),
        policy_version=policy_version,
    )


def env_proxy_for(url: str) -> str | None:
    """The proxy the environment (``HTTP_PROXY``/``HTTPS_PROXY``, ``NO_PROXY``) sets for ``url``, or None.

    Resolved with the standard library's rules, the same ones ``urllib`` and ``requests`` apply."""
    parts = urllib.parse.urlsplit(url)
    if parts.hostname is None or urllib.request.proxy_bypass(parts.hostname):
        return None
    return urllib.request.getproxies().get(parts.scheme)


class PolicyClient:
    """Async client of one deployment's base URL (the router, or a single engine).

    ``timeout_s`` bounds one HTTP request (seconds); transient failures (connect errors, timeouts, HTTP 408/429/5xx)
    are retried ``max_retries`` times with exponential backoff starting at ``backoff_s`` seconds, then raise
    ProviderError. With ``retry_budget_s`` (seconds) they are instead retried until that much time has passed
    since the request began (backoff capped at ``MAX_BACKOFF_S``), time spent waiting at a closed serving gate
    included. ``policy_version`` is the version the client believes is served; the weight updater's owner sets it
    after each successful update. ``run_id`` (the run whose policy this client samples; ``lora``: a run that trains an
    adapter) turns on the owner check: a Generation then carries the version its engine reported (``versions.judge``),
    and
    ``foreign_version`` when any of its tokens came from another run's weights; without it (or from an engine
    without srl's middleware) it carries the believed version.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        timeout_s: float = 600.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        policy_version: int = 0,
        max_connections: int = 256,
        retry_budget_s: float | None = None,
        headers: dict[str, str] | None = None,
        run_id: str | None = None,
        lora: bool = False,
    ) -> None:
        self.run_id = run_id
        self.lora = lora
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.policy_version = policy_version
        self.retry_budget_s = retry_budget_s
        self._open = asyncio.Event()
        self._open.set()
        self._epoch = 0  # incremented at each hold(): a response from an older epoch is not trusted
        self._held_since: float | None = None
        self._held_total_s = 0.0
        self.max_connections = max_connections
        self._headers = dict(headers or {})  # e.g. an API key read from the environment; kept in memory only
        self._http: aiohttp.ClientSession | None = None  # made on first use, inside the event loop that uses it
        self.retries = 0  # requests sent again after a transient failure (a replica that left, a restart, a 5xx)
        self._pending: dict[tuple, _Coalesced] = {}  # requests of this pass of the event loop, by prompt and sampling

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None:
            self._http = aiohttp.ClientSession(
                headers=self._headers,
                timeout=aiohttp.ClientTimeout(total=self.timeout_s, connect=min(10.0, self.timeout_s)),
                connector=aiohttp.TCPConnector(limit=self.max_connections),
                proxy=env_proxy_for(self.base_url),
                # Not trust_env: aiohttp then re-reads ~/.netrc and the proxy variables in a thread on every
                # request (two thread round trips per completion, a third of the client's CPU in the benchmark).
                # The one endpoint's proxy is resolved once above; credentials come from ``headers``.
            )
        return self._http

    # -- serving gate -------------------------------------------------------------------------------------------
    def hold(self) -> None:
        """Close the serving gate: requests wait, and responses to requests already in flight are discarded and
        the requests re-sent after :meth:`release` (idempotent)."""
        if self._open.is_set():
            self._open.clear()
            self._epoch += 1
            self._held_since = time.monotonic()

    def release(self) -> None:
        """Open the serving gate (idempotent)."""
        if not self._open.is_set():
            self._held_total_s += time.monotonic() - (self._held_since or time.monotonic())
            self._held_since = None
            self._open.set()

    @property
    def held(self) -> bool:
        """Whether the serving gate is closed now."""
        return not self._open.is_set()

    def outage_seconds(self) -> float:
        """Seconds the gate has been closed since this client was made (the current hold included); a rollout
        deadline is extended by the growth of this figure (``EnvRuntime``), so an engine restart does not time
        rollouts out."""
        current = time.monotonic() - self._held_since if self._held_since is not None else 0.0
        return self._held_total_s + current

    async def _wait_open(self, deadline: float | None) -> None:
        if self._open.is_set():
            return
        limit = self.timeout_s if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            await asyncio.wait_for(self._open.wait(), limit)
        except TimeoutError:
            raise ProviderError(
                f"{self.base_url}: inference still unavailable (held for a restarting engine) after {limit:.0f} s"
            ) from None

    async def _post(
        self,
        path: str,
        *,
        json: dict | None = None,
        headers: dict | None = None,
    ) -> tuple[dict[str, Any], int, Any]:
        """POST with retries; returns the JSON body of the response, the policy version believed served when
        the answered attempt was sent (after any wait at the gate, so a restore that happened meanwhile is
        reflected) and the response's headers."""
        deadline = None if self.retry_budget_s is None else time.monotonic() + self.retry_budget_s
        last: str = ""
        attempt = 0
        while True:
            await self._wait_open(deadline)
            epoch = self._epoch
            version = self.policy_version
            status, text, data, answer_headers = 0, "", None, None
            try:
                async with self._session().post(self.base_url + path, json=json, headers=headers) as resp:
                    status = resp.status
                    answer_headers = resp.headers
                    if status < 400 and epoch == self._epoch:
                        data = await resp.json(content_type=None)
                    else:
                        text = await resp.text(errors="replace")
            except _RETRY_EXC as exc:
                last = f"{type(exc).__name__}: {exc or 'timed out'}"
            except ValueError as exc:  # a 2xx body that is not JSON: not an OpenAI-compatible endpoint
                raise ProviderError(f"{self.base_url}{path} answered HTTP {status} without JSON: {exc}") from exc
            else:
                if epoch != self._epoch:
                    last = "the serving gate closed while the request was in flight"
                elif status in _RETRY_STATUSES:
                    last = f"HTTP {status}: {text[:300]}"
                elif status >= 400:
                    raise ProviderError(f"{self.base_url}{path} rejected the request: HTTP {status}: {text[:500]}")
                else:
                    return data, version, answer_headers
            attempt += 1
            self.retries += 1
            delay = self.backoff_s * 2 ** (attempt - 1)
            if deadline is None:
                if attempt > self.max_retries:
                    raise ProviderError(f"{self.base_url}{path} failed after {attempt} attempts: {last}")
            else:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ProviderError(
                        f"{self.base_url}{path} failed for {self.retry_budget_s:.0f} s ({attempt} attempts): {last}"
                    )
                delay = min(delay, MAX_BACKOFF_S, left)
            if epoch != self._epoch and not self._open.is_set():
                continue  # the gate closed: wait for it to open rather than backing off blindly
            await asyncio.sleep(delay)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, *, session_id: str) -> Generation:
        """Sample one completion of ``prompt_ids`` (token ids); returns ids, sampling logprobs, finish reason.

        ``session_id`` identifies the rollout (sticky routing). ``latency_s`` is the wall time including retries.
        Raises ProviderError after the retries are spent or on a non-retryable rejection.

        Unseeded calls for the same prompt and sampling made in the same pass of the event loop (a group's
        rollouts, which start together) go out as one request for that many samples (vLLM's ``n``; the engine
        fans it out into independent samples): the engine's API server parses, validates and answers one request
        instead of a group's worth, on the cores it shares with the engine. Each call still gets its own
        Generation, and the request's retries, serving gate and version check apply to all of them. Seeded calls
        (evals) go out alone, so that a seed keeps meaning the same draw.
        """
        t0 = time.monotonic()
        if sampling.seed is not None:
            gen = (await self._generate_n(prompt_ids, sampling, session_id=session_id, n=1))[0]
            gen.latency_s = time.monotonic() - t0
            return gen
        key = _sampling_key(prompt_ids, sampling)
        batch = self._pending.get(key)
        if batch is None or batch.task.get_loop() is not asyncio.get_running_loop():  # not from a finished loop
            batch = self._pending[key] = _Coalesced(session_id)
            # A task's first step runs on the next pass, once every call of this pass has joined.
            batch.task = asyncio.ensure_future(self._send(key, batch, list(prompt_ids), sampling))
        index = batch.n
        batch.n += 1
        batch.waiting += 1
        try:
            gens = await asyncio.shield(batch.task)
        except asyncio.CancelledError:
            batch.waiting -= 1
            if batch.waiting == 0:
                batch.task.cancel()  # nobody is left to use the samples
            raise
        except ProviderError as exc:
            raise ProviderError(str(exc)) from exc  # one exception object per caller: they are raised concurrently
        batch.waiting -= 1
        gen = dataclasses.replace(gens[index])
        gen.latency_s = time.monotonic() - t0
        return gen

    async def _send(self, key: tuple, batch: _Coalesced, prompt_ids: list[int], sampling: SamplingParams):
        if self._pending.get(key) is batch:
            del self._pending[key]  # later calls start a new request
        return await self._generate_n(prompt_ids, sampling, session_id=batch.session_id, n=batch.n)

    async def _generate_n(
        self, prompt_ids: list[int], sampling: SamplingParams, *, session_id: str, n: int
    ) -> list[Generation]:
        """``n`` samples of ``prompt_ids`` in one request, each with the policy version the engine reported."""
        body = completion_payload(self.model, prompt_ids, sampling)
        if n > 1:
            body["n"] = n
        data, version, answer_headers = await self._post(  # version: believed served when the request was sent
            "/v1/completions", json=body, headers={SESSION_HEADER: session_id}
        )
        gens = parse_choices(data, n, version)
        adapter = answer_headers.get(ADAPTER_VERSION_HEADER)
        verdict = judge(
            self.run_id,
            version,
            split_header(answer_headers.get(VERSION_HEADER)),
            None if adapter is None else split_header(adapter),
            lora=self.lora,
        )
        for gen in gens:
            gen.policy_version, gen.foreign_version = verdict.version, verdict.foreign
        return gens

    async def aclose(self) -> None:
        """Close the connection pool."""
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def __aenter__(self) -> PolicyClient:  # noqa: PYI034 - Python 3.10 has no typing.Self
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
