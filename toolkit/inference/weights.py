"""Live policy-weight updates of running vLLM engines from the trainer's broadcast directories.

The trainer writes ``<run>/broadcasts/step_<n>/`` (HF safetensors) and a ``STABLE`` marker last. The updater then,
on every engine directly (admin calls never go through the router, which would deliver them to one replica only):

1. ``POST /pause?mode=keep``: freeze scheduling; queued and running requests stay and continue after resume
   (the asynchronous-RL choice: in-flight rollouts finish on the new weights instead of being aborted),
2. ``POST /collective_rpc`` ``{"method": "srl_reload_weights", "kwargs": {"weights_path": DIR}}`` on engines
   started with srl's worker extension (``toolkit.inference.worker_ext``: vLLM's reload with freed memory kept
   for reuse, which halves the CPU re-pack of the weights), else ``{"method": "reload_weights", ...}`` (vLLM dev mode).
   Which one an engine has is read from its ``GET /server_info`` (``parallel_config.worker_extension_cls``) before the
   first pause; an unknown collective_rpc method would make vLLM 0.32 stop the engine, so it is never tried blindly,
3. KV file stores of the engines' connectors (vLLM's ExampleConnector, CPU prefill/decode) are retired
   (``toolkit.inference.kv_store``): their files hold KV computed by the old weights, keyed by prompt tokens only,
   and vLLM's cache reset does not touch them. Each engine's store is read once from ``GET /server_info``,
   before the first pause,
4. ``POST /reset_prefix_cache?reset_external=true&reset_running_requests=true`` (cached KV was computed by the
   old weights; connectors that implement a reset clear theirs too). Without ``reset_running_requests`` vLLM
   refuses the reset (``{"success": false}``) while running requests hold cache blocks, which is the normal case
   with ``mode=keep``, so the updater asks with it at once (one admin call less per update on the critical path):
   vLLM preempts those requests and they recompute their KV on the new weights after resume; with nothing
   running there is nothing to preempt. A refused reset raises WeightUpdateError,
5. ``POST /update_weight_version`` (recorded by the engine, readable at ``/weight_info``) with the owner's version
   ``"<run id>:<step>"`` (``versions.format_version``: a step alone cannot tell two runs apart); step 3 runs
   concurrently with steps 4-5 (all need only the pause),
6. ``POST /resume``; retired KV files are then deleted, outside the pause window.

Engines are paused all together and resumed all together, so no replica serves the new version while another
still serves the old one. Every call carries the run's admin token (header ``X-SRL-Admin-Token``): the engines'
guard middleware refuses admin routes without it (``toolkit.inference.guard``). vLLM 0.32 leaves a tied output layer on
the old weights after a reload: models must be saved untied (``tie_word_embeddings: false`` and an explicit
``lm_head.weight``); ``check_untied`` refuses others.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import ssl
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import httpx

from toolkit.engines.admin_token import admin_headers, admin_token_from_env
from toolkit.inference.kv_store import kv_store_from_config, purge_retired, retire_kv_store
from toolkit.inference.versions import (
    BASE_VERSIONS,
    VERSION_HEADER,
    VERSIONS_PATH,
    format_version,
    lora_name,
    parse_version,
)
from toolkit.inference.worker_ext import EXTENSION_CLS, RELOAD_METHOD, RESULT_MARKER

# A LoRA run's broadcasts are PEFT adapter directories (toolkit.trainer.lora); engines serve them under this name.
LORA_ADAPTER_CONFIG = "adapter_config.json"
DEFAULT_LORA_NAME = "srl-policy-lora"
# Where engines read the served adapter from: one fixed directory next to the broadcasts (see stage_adapter).
LORA_SERVED_DIR = "lora_served"
_ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
# vLLM's /pause mode: queued and running requests stay and continue after resume (module doc, step 1).
_PAUSE = {"mode": "keep"}


class WeightUpdateError(RuntimeError):
    """A weight update failed on an engine; the message names the engine URL and the step that failed."""


def is_lora_adapter(broadcast_dir: Path) -> bool:
    """True when ``broadcast_dir`` holds a PEFT adapter (``adapter_config.json``), i.e. a LoRA run's broadcast."""
    return (Path(broadcast_dir) / LORA_ADAPTER_CONFIG).is_file()


def stage_adapter(broadcast_dir: Path) -> Path:
    """Copy the adapter of ``broadcast_dir`` into the fixed ``<broadcasts>/lora_served/`` and return that path.

    Why one fixed path: vLLM 0.32 keeps the ``LoRARequest`` (with its path) in every request that named the adapter,
    and because the in-place load sets ``load_inplace``, each engine step re-reads the adapter from the path of
    the request added to the batch last (``gpu_input_batch.lora_id_to_lora_request``,
    ``LRUCacheWorkerLoRAManager.add_adapter``). With one path per version, a request from before an update (kept
    through the pause, or preempted and re-added) would switch the whole batch back to the old adapter, or fail once
    retention deleted it. With one path whose content is always the newest adapter, every request runs the newest
    policy. Call only while the engines are paused (no step reads the files); each file is replaced atomically.
    Raises OSError.
    """
    from toolkit.fsutil import atomic_write_bytes

    served = Path(broadcast_dir).absolute().parent / LORA_SERVED_DIR
    served.mkdir(exist_ok=True)
    for name in _ADAPTER_FILES:  # adapters are small (MBs): read whole, write through temp file + fsync + rename
        atomic_write_bytes(served / name, (Path(broadcast_dir) / name).read_bytes())
    return served


def check_untied(model_dir: Path) -> None:
    """Raise WeightUpdateError if ``model_dir/config.json`` declares tied embeddings (vLLM 0.32 reload bug: the
    output layer keeps the old weights while the embedding changes). A missing config is not checked."""
    cfg = Path(model_dir) / "config.json"
    if not cfg.exists():
        return
    data = json.loads(cfg.read_text())
    tied = data.get("tie_word_embeddings", (data.get("text_config") or {}).get("tie_word_embeddings", False))
    if tied:
        raise WeightUpdateError(
            f"{model_dir} has tie_word_embeddings=true: vLLM reload would leave lm_head stale; save it untied"
        )


class WeightUpdater:
    """Pushes new policy weights into every engine of a deployment.

    ``engine_urls`` are the engines' own base URLs (never the router). ``timeout_s`` bounds each admin call
    (seconds); the call that loads a broadcast gets ``s_per_gib`` seconds more per GiB of weights it reads, so the
    bound grows with the model (the orchestrator passes ``monitors.stall_s_per_gib``). ``admin_token`` is the
    deployment's admin token; None reads ``SRL_ADMIN_TOKEN`` from this process's environment (set by srl's
    launchers). Without one, the engines answer
    401/403 and updates raise WeightUpdateError. ``profile_reload`` asks engines with srl's worker extension for a
    per-phase breakdown of their reload (``last_reload``; benchmarks). ``run_id``: the run whose weights these
    are; versions are recorded as ``"<run id>:<step>"`` and a LoRA run's adapter is served as ``srl-lora-<run id>``
    (None: bare step numbers and one fixed adapter name, for tools outside a run).
    """

    def __init__(
        self,
        engine_urls: Sequence[str],
        *,
        timeout_s: float = 300.0,
        s_per_gib: float = 0.0,
        admin_token: str | None = None,
        profile_reload: bool = False,
        run_id: str | None = None,
    ) -> None:
        if not engine_urls:
            raise ValueError("WeightUpdater needs at least one engine URL")
        self._headers = admin_headers(admin_token or admin_token_from_env())  # kept out of repr and messages
        self.engine_urls = [u.rstrip("/") for u in engine_urls]
        # engines that joined later with an admin token of their own (elastic replicas: add_engine)
        self._engine_headers: dict[str, dict[str, str]] = {}
        self.timeout_s = timeout_s
        self.s_per_gib = s_per_gib
        self._optional_missing: set[tuple[str, str]] = set()  # (url, path) the engine does not offer
        # engine URL -> its connector's KV file store (None: no file store). A restarted engine runs the same
        # command, hence the same store, so one lookup per URL holds for the updater's life.
        self._kv_stores: dict[str, Path | None] = {}
        self.last_retired_kv_entries = 0  # prompt folders made unreachable by the last update
        # engine URL -> the collective_rpc method that reloads it (RELOAD_METHOD or "reload_weights"), read with
        # the KV store from /server_info, once per URL (same assumption: a restarted engine runs the same command)
        self.reload_methods: dict[str, str] = {}
        self.profile_reload = profile_reload
        # engine URL -> the worker extension's answer for the last update (seconds, bytes, phases when profiled)
        self.last_reload: dict[str, dict] = {}
        # LoRA runs (load_broadcast): the name the adapter is served under, and the model name requests must use
        # (None = the deployment's base model name, until an adapter has been loaded).
        self.run_id = run_id
        self.lora_name = lora_name(run_id) if run_id else DEFAULT_LORA_NAME
        self.served_model: str | None = None
        # seconds per step of the last successful load (update, adapter): client, kv_store_lookup, pause, reload,
        # retire_reset_version (KV store retired while prefix caches are reset and the version set), resume,
        # kv_store_purge (benchmarks, reload records)
        self.last_steps: dict[str, float] = {}
        # One HTTP client (and its open connections) for every update of this event loop: a client per update
        # paid a TCP connect per engine and call sequence on every step (see _session).
        self._http: httpx.AsyncClient | None = None
        self._http_loop: asyncio.AbstractEventLoop | None = None

    def add_engine(self, url: str, admin_token: str | None) -> None:
        """Include the engine at ``url`` in every later update (an elastic replica that joined the run), with its
        own ``admin_token`` (its deployment's, not the run's). Idempotent. The caller loads the served policy into
        it first (an updater of its own), holding the lock that orders updates."""
        url = url.rstrip("/")
        self._engine_headers[url] = admin_headers(admin_token)
        if url not in self.engine_urls:
            self.engine_urls.append(url)

    def remove_engine(self, url: str) -> None:
        """Leave the engine at ``url`` out of later updates (a replica that left); its cached lookups go too."""
        url = url.rstrip("/")
        self.engine_urls = [u for u in self.engine_urls if u != url]
        self._engine_headers.pop(url, None)
        self._kv_stores.pop(url, None)
        self.reload_methods.pop(url, None)
        self._optional_missing = {(u, p) for u, p in self._optional_missing if u != url}

    async def _call(
        self, http: httpx.AsyncClient, url: str, path: str, *, optional: bool = False, method: str = "POST", **kw
    ) -> httpx.Response | None:
        if (url, path) in self._optional_missing:
            return None
        if url in self._engine_headers:
            kw["headers"] = {**self._engine_headers[url], **kw.get("headers", {})}
        try:
            resp = await http.request(method, url + path, **kw)
        except httpx.HTTPError as exc:
            raise WeightUpdateError(f"{url}{path}: {type(exc).__name__}: {exc}") from exc
        if optional and resp.status_code in (404, 405):
            self._optional_missing.add((url, path))  # engine without dev mode or an older vLLM
            return None
        if resp.status_code >= 400:
            raise WeightUpdateError(f"{url}{path}: HTTP {resp.status_code}: {resp.text[:500]}")
        return resp

    async def _all(self, http: httpx.AsyncClient, path: str, *, optional: bool = False, **kw) -> None:
        await _on_every_engine(self._call(http, url, path, optional=optional, **kw) for url in self.engine_urls)

    async def update(self, broadcast_dir: Path, version: int, *, label: str | None = None) -> float:
        """Load the HF safetensors directory ``broadcast_dir`` as policy ``version`` into every engine.

        ``label``: the version string the engines record instead of ``"<run id>:<version>"`` (``"base"``: the
        deployment's base model loaded back, see :meth:`reset_base`).

        Returns the wall time in seconds from the first pause to the last resume. Raises WeightUpdateError naming
        the engine URL on any failure; engines are resumed (best effort) before it propagates, so a failed update
        never leaves a deployment paused.
        """
        broadcast_dir = Path(broadcast_dir).absolute()
        check_untied(broadcast_dir)
        label = label or format_version(self.run_id, version)
        return await self._paused(lambda http: self._reload_all(http, broadcast_dir), label)

    async def _paused(self, load: Callable[[httpx.AsyncClient], Awaitable[None]], version: str | None) -> float:
        """The update protocol (module doc) around ``load(http)``, which loads new weights into the paused
        engines; ``version``: the base weights' new version (None: leave it). Sets ``last_steps`` and returns the
        seconds from the first pause to the last resume. Engines are resumed (best effort) before any error
        propagates."""
        steps: dict[str, float] = {}
        mark = time.monotonic()

        def lap(name: str) -> None:  # seconds spent in each step, for self.last_steps
            nonlocal mark
            now = time.monotonic()
            steps[name] = now - mark
            mark = now

        async with self._session() as http:
            lap("client")
            # Before the pause, not during it: vLLM's first /server_info collects its environment (once per
            # engine; 0.5 s idle, 8 s on a loaded 2-core host), which must not stall generation.
            stores = await self._kv_file_stores(http)
            lap("kv_store_lookup")
            t0 = mark
            try:
                await self._all(http, "/pause", optional=True, params=_PAUSE)
                lap("pause")
                await load(http)
                lap("reload")
                # The file store is retired while the engines' caches are reset (both only need the pause). P/D
                # file stores key KV by prompt tokens only, not by adapter: an old adapter's KV must go too.
                results = await asyncio.gather(
                    self._retire_kv_stores(stores), self._reset_and_version(http, version), return_exceptions=True
                )
                errors = [r for r in results if isinstance(r, BaseException)]
                if errors:
                    raise errors[0]
                lap("retire_reset_version")
            except BaseException:  # resume every engine, each one tried even when another fails
                await asyncio.gather(
                    *(self._call(http, u, "/resume", optional=True) for u in self.engine_urls), return_exceptions=True
                )
                raise
            await self._all(http, "/resume", optional=True)
            lap("resume")
        seconds = mark - t0
        for store in stores:  # after resume: deleting many KV files must not lengthen the pause
            await asyncio.to_thread(purge_retired, store)
        lap("kv_store_purge")
        self.last_steps = steps
        return seconds

    async def prepare(self) -> list[Path]:
        """Look up the engines' KV file stores now (what the first :meth:`update` does otherwise, before its
        pause). vLLM's first ``/server_info`` collects its environment: 0.5-8 s per engine (2-core host,
        idle to loaded), so a caller that knows its first update is coming (the orchestrator, once inference is
        ready) takes it off the STABLE-to-serving path. Returns the distinct stores; raises WeightUpdateError."""
        async with self._session() as http:
            return await self._kv_file_stores(http)

    @contextlib.asynccontextmanager
    async def _session(self):
        """The updater's kept-open client for the running event loop (a new one when the loop changed, as with
        successive ``asyncio.run`` calls; the old one's connections belong to a loop that is gone). Connections
        stay open between updates: an update is ~8 admin calls and one runs every trainer step."""
        loop = asyncio.get_running_loop()
        if self._http is None or self._http.is_closed or self._http_loop is not loop:
            self._http, self._http_loop = self._client(), loop
        yield self._http

    async def aclose(self) -> None:
        """Close the kept-open client (idempotent); the next call opens a new one."""
        http, self._http = self._http, None
        if http is not None and not http.is_closed and self._http_loop is asyncio.get_running_loop():
            await http.aclose()

    def _client(self, timeout_s: float | None = None) -> httpx.AsyncClient:
        """An HTTP client with the admin headers and the shared TLS context (a fresh httpx client otherwise loads
        the CA bundle again: ~0.1-0.25 s per update, measured by tests/benchmarks/weight_sync.py)."""
        return httpx.AsyncClient(
            timeout=self.timeout_s if timeout_s is None else timeout_s,
            headers=self._headers,
            verify=_tls_context(),
        )

    async def _reload_all(self, http: httpx.AsyncClient, broadcast_dir: Path) -> None:
        """Reload every engine from ``broadcast_dir`` (engines paused), each with its own method (module doc,
        step 2). Raises WeightUpdateError naming the engine."""
        self.last_reload = {}
        timeout = self.reload_timeout_s(broadcast_dir)

        async def reload(url: str) -> None:
            method = self.reload_methods.get(url, "reload_weights")
            kwargs: dict[str, object] = {"weights_path": str(broadcast_dir)}
            if method == RELOAD_METHOD and self.profile_reload:
                kwargs["profile"] = True
            resp = await self._call(
                http, url, "/collective_rpc", json={"method": method, "kwargs": kwargs}, timeout=timeout
            )
            if method == RELOAD_METHOD and resp is not None:
                self.last_reload[url] = _extension_answer(url, resp)

        await _on_every_engine(reload(u) for u in self.engine_urls)

    def reload_timeout_s(self, broadcast_dir: Path) -> float:
        """Seconds the admin call that loads ``broadcast_dir`` may take: ``timeout_s`` plus ``s_per_gib`` per GiB
        of its files (a hard-coded bound that suits a small model kills the update of a large one)."""
        size = sum(f.stat().st_size for f in Path(broadcast_dir).iterdir() if f.is_file())
        return self.timeout_s + self.s_per_gib * size / 2**30

    async def _reset_and_version(self, http: httpx.AsyncClient, version: str | None) -> None:
        """Reset the prefix caches, then record ``version`` as the base weights' version (None: leave it; an
        adapter load carries its own version)."""
        await self._reset_prefix_caches(http)
        if version is not None:
            await self._all(http, "/update_weight_version", optional=True, json={"new_version": version})

    async def reset_base(self, model_dir: Path) -> float | None:
        """Load ``model_dir`` (the run's base model) into engines whose base weights are another run's, and record
        them as ``"base"``; do nothing when every engine serves the base model or this run's own weights. For a run
        that starts on an external deployment another run used before: without it, every rollout would be sampled
        with that run's weights and dropped. Returns the load's seconds, or None when nothing was loaded. Raises
        WeightUpdateError."""
        versions = await self.served_versions()
        foreign = sorted(
            {v for v in versions.values() if v is not None and v not in BASE_VERSIONS and _owner(v) != self.run_id}
        )
        if not foreign:
            return None
        return await self.update(Path(model_dir), 0, label="base")

    async def _kv_file_stores(self, http: httpx.AsyncClient) -> list[Path]:
        """The distinct KV file stores of the engines (usually none, or one shared by all P/D engines); looks up
        engines not seen before with ``GET /server_info?config_format=json``, which also tells whether the engine
        runs srl's worker extension (``reload_methods``). An engine without the route (no dev mode, older vLLM:
        404/405) counts as storeless and without the extension. Raises WeightUpdateError on other failures."""

        async def lookup(url: str) -> None:
            resp = await self._call(
                http, url, "/server_info", optional=True, method="GET", params={"config_format": "json"}
            )
            try:
                config = None if resp is None else resp.json().get("vllm_config")
            except ValueError as exc:
                raise WeightUpdateError(f"{url}/server_info: not JSON: {resp.text[:200]}") from exc
            self._kv_stores[url] = kv_store_from_config(config) if isinstance(config, dict) else None
            self.reload_methods[url] = RELOAD_METHOD if _has_extension(config) else "reload_weights"

        new = [u for u in self.engine_urls if u not in self._kv_stores]
        await _on_every_engine(lookup(u) for u in new)
        return sorted({s for u in self.engine_urls if (s := self._kv_stores[u]) is not None})

    async def _retire_kv_stores(self, stores: Sequence[Path]) -> None:
        """Make the old policy's KV files unreachable (engines are paused: nothing writes them now)."""
        moved = 0
        for store in stores:
            try:
                n, _ = await asyncio.to_thread(retire_kv_store, store)
            except OSError as exc:
                raise WeightUpdateError(f"cannot retire KV store {store}: {exc}") from exc
            moved += n
        self.last_retired_kv_entries = moved

    async def _reset_prefix_caches(self, http: httpx.AsyncClient) -> None:
        """Reset every engine's prefix cache (and its connector's, where vLLM can); see the module doc, step 4."""
        params = {"reset_external": "true", "reset_running_requests": "true"}

        async def reset(url: str) -> None:
            resp = await self._call(http, url, "/reset_prefix_cache", optional=True, params=params)
            if resp is not None and not _reset_succeeded(resp):
                raise WeightUpdateError(
                    f"{url}/reset_prefix_cache: the engine kept its prefix cache even after "
                    "preempting its running requests"
                )

        await _on_every_engine(reset(u) for u in self.engine_urls)

    async def load_broadcast(self, broadcast_dir: Path, version: int) -> float:
        """Load the trainer's broadcast ``broadcast_dir`` as policy ``version``: full weights via :meth:`update`,
        or, for a PEFT adapter directory (a LoRA run), in place under ``lora_name``.

        The adapter path keeps the full path's protocol: engines paused together, the adapter copied to the fixed
        served path (:func:`stage_adapter`) and loaded from there (``/v1/load_lora_adapter`` with
        ``load_inplace``), prefix caches reset and KV file stores retired, the version recorded at
        ``/weight_info``, resumed together (also on failure). After an adapter load ``served_model`` is
        ``lora_name``, the model name generation requests must carry. The adapter's version travels in header
        ``X-SRL-Weight-Version`` of the load (the engine's middleware records it per adapter); the base weights'
        version is left alone, so LoRA runs sharing a deployment never overwrite each other's. Engines need
        ``commands.lora_engine_args`` and ``commands.LORA_ENGINE_ENV``. Returns seconds from the first pause
        to the last resume; raises WeightUpdateError naming the engine URL.
        """
        broadcast_dir = Path(broadcast_dir).absolute()
        if not is_lora_adapter(broadcast_dir):
            return await self.update(broadcast_dir, version)

        async def load_adapter(http: httpx.AsyncClient) -> None:
            served = await asyncio.to_thread(stage_adapter, broadcast_dir)
            body = {"lora_name": self.lora_name, "lora_path": str(served), "load_inplace": True}
            tag = {VERSION_HEADER: format_version(self.run_id, version)}
            await self._all(http, "/v1/load_lora_adapter", json=body, headers=tag)

        seconds = await self._paused(load_adapter, None)
        self.served_model = self.lora_name
        return seconds

    async def served_versions(self) -> dict[str, str | None]:
        """Each engine's recorded weight version, None where unavailable: of the base weights (``GET
        /weight_info``), or, once this updater has loaded an adapter, of that adapter (``GET /srl/weight_versions``,
        srl's engine middleware)."""
        out: dict[str, str | None] = {}
        async with self._session() as http:
            for url in self.engine_urls:
                try:
                    headers = self._engine_headers.get(url)
                    if self.served_model:
                        resp = await http.get(url + VERSIONS_PATH, timeout=10.0, headers=headers)
                        data = resp.json() if resp.status_code == 200 else {}
                        out[url] = (data.get("adapters") or {}).get(self.served_model)
                    else:
                        resp = await http.get(url + "/weight_info", timeout=10.0, headers=headers)
                        out[url] = resp.json().get("weight_version") if resp.status_code == 200 else None
                except (httpx.HTTPError, ValueError, AttributeError):
                    out[url] = None
        return out


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """One TLS context for every client of this process (httpx's default trust: certifi, SSL_CERT_FILE/DIR),
    built once: engines may sit behind https."""
    return httpx.create_ssl_context()


async def _on_every_engine(calls: Iterable[Awaitable[Any]]) -> None:
    """Run one call per engine concurrently and let every call finish; raises WeightUpdateError joining the
    messages of all that failed (each names its engine URL), chained to the first."""
    results = await asyncio.gather(*calls, return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        raise WeightUpdateError("; ".join(str(e) for e in errors)) from errors[0]


def _has_extension(vllm_config: object) -> bool:
    """True when a ``/server_info`` ``vllm_config`` shows srl's worker extension loaded in the engine's workers."""
    if not isinstance(vllm_config, dict):
        return False
    parallel = vllm_config.get("parallel_config")
    return isinstance(parallel, dict) and parallel.get("worker_extension_cls") == EXTENSION_CLS


def _extension_answer(url: str, resp: httpx.Response) -> dict:
    """The first worker's answer to ``srl_reload_weights`` (one per worker; all must carry ``RESULT_MARKER`` and no
    ``error``). Raises WeightUpdateError otherwise: without the marker there is no proof the weights were loaded."""
    try:
        results = resp.json().get("results")
    except (ValueError, AttributeError):
        results = None
    where = f"{url}/collective_rpc {RELOAD_METHOD}"
    if not isinstance(results, list) or not results:
        raise WeightUpdateError(f"{where}: unexpected answer {resp.text[:300]!r}")
    for result in results:
        if not isinstance(result, dict) or RESULT_MARKER not in result:
            raise WeightUpdateError(f"{where}: unexpected answer {resp.text[:300]!r}")
        if "error" in result:
            raise WeightUpdateError(f"{where}: {result['error']}")
    return results[0]


def _owner(version: str) -> str | None:
    parsed = parse_version(version)
    return parsed[0] if parsed else None


def _reset_succeeded(resp: httpx.Response) -> bool:
    """False only when the engine says ``{"success": false}`` (vLLM 0.32); any other answer counts as done."""
    try:
        data = resp.json()
    except ValueError:
        return True
    return not (isinstance(data, dict) and data.get("success") is False)
