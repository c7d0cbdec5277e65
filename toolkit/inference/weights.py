"""Live policy-weight updates of running vLLM engines from the trainer's broadcast directories.

The trainer writes ``<run>/broadcasts/step_<n>/`` (HF safetensors) and a ``STABLE`` marker last. The updater then,
on every engine directly (admin calls never go through the router, which would deliver them to one replica only):

1. ``POST /pause?mode=keep``: freeze scheduling; queued and running requests stay and continue after resume
   (the asynchronous-RL choice: in-flight rollouts finish on the new weights instead of being aborted),
2. ``POST /collective_rpc`` ``{"method": "reload_weights", "kwargs": {"weights_path": DIR}}`` (vLLM dev mode),
3. ``POST /reset_prefix_cache`` (cached KV was computed by the old weights),
4. ``POST /update_weight_version`` (recorded by the engine, readable at ``/weight_info``),
5. ``POST /resume``.

Engines are paused all together and resumed all together, so no replica serves the new version while another
still serves the old one. Every call carries the run's admin token (header ``X-SRL-Admin-Token``): the engines'
guard middleware refuses admin routes without it (``toolkit.inference.guard``). vLLM 0.32 leaves a tied output layer on the old weights after a reload: models must be
saved untied (``tie_word_embeddings: false`` and an explicit ``lm_head.weight``); ``check_untied`` refuses others.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from toolkit.inference.admin_token import admin_headers, admin_token_from_env
from toolkit.rundir import RunDir, numbered_steps

STABLE_MARKER = "STABLE"


class WeightUpdateError(RuntimeError):
    """A weight update failed on an engine; the message names the engine URL and the step that failed."""


def newest_stable_broadcast(run: RunDir) -> tuple[int, Path] | None:
    """The newest ``broadcasts/step_<n>`` holding a STABLE marker, as ``(n, dir)``, or None when there is none."""
    for step in reversed(numbered_steps(run.broadcasts)):
        d = run.broadcast_step(step)
        if (d / STABLE_MARKER).exists():
            return step, d
    return None


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
    (seconds). ``pause_mode`` is vLLM's /pause mode: "keep" (default: freeze, continue after resume), "wait"
    (drain in-flight requests first) or "abort". ``admin_token`` is the deployment's admin token; None reads
    ``SRL_ADMIN_TOKEN`` from this process's environment (set by srl's launchers). Without one, the engines answer
    401/403 and updates raise WeightUpdateError.
    """

    def __init__(
        self,
        engine_urls: Sequence[str],
        *,
        timeout_s: float = 300.0,
        pause_mode: str = "keep",
        admin_token: str | None = None,
    ) -> None:
        if not engine_urls:
            raise ValueError("WeightUpdater needs at least one engine URL")
        self._headers = admin_headers(admin_token or admin_token_from_env())  # kept out of repr and messages
        self.engine_urls = [u.rstrip("/") for u in engine_urls]
        self.timeout_s = timeout_s
        self.pause_mode = pause_mode
        self.served_version: int | None = None
        self._optional_missing: set[tuple[str, str]] = set()  # (url, path) the engine does not offer

    async def _call(self, http: httpx.AsyncClient, url: str, path: str, *, optional: bool = False,
                    **kw) -> httpx.Response | None:  # fmt: skip
        if (url, path) in self._optional_missing:
            return None
        try:
            resp = await http.post(url + path, **kw)
        except httpx.HTTPError as exc:
            raise WeightUpdateError(f"{url}{path}: {type(exc).__name__}: {exc}") from exc
        if optional and resp.status_code in (404, 405):
            self._optional_missing.add((url, path))  # engine without dev mode or an older vLLM
            return None
        if resp.status_code >= 400:
            raise WeightUpdateError(f"{url}{path}: HTTP {resp.status_code}: {resp.text[:500]}")
        return resp

    async def _all(self, http: httpx.AsyncClient, path: str, *, optional: bool = False, **kw) -> None:
        results = await asyncio.gather(
            *(self._call(http, url, path, optional=optional, **kw) for url in self.engine_urls),
            return_exceptions=True,
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise WeightUpdateError("; ".join(str(e) for e in errors)) from errors[0]

    async def update(self, broadcast_dir: Path, version: int) -> float:
        """Load the HF safetensors directory ``broadcast_dir`` as policy ``version`` into every engine.

        Returns the wall time in seconds from the first pause to the last resume. Raises WeightUpdateError naming
        the engine URL on any failure; engines are resumed (best effort) before it propagates, so a failed update
        never leaves a deployment paused.
        """
        broadcast_dir = Path(broadcast_dir).absolute()
        check_untied(broadcast_dir)
        t0 = time.monotonic()
        async with httpx.AsyncClient(timeout=self.timeout_s, headers=self._headers) as http:
            try:
                await self._all(http, "/pause", optional=True, params={"mode": self.pause_mode})
                await self._all(
                    http,
                    "/collective_rpc",
                    json={"method": "reload_weights", "kwargs": {"weights_path": str(broadcast_dir)}},
                )
                await self._all(http, "/reset_prefix_cache", optional=True)
                await self._all(
                    http, "/update_weight_version", optional=True, json={"new_version": str(version)}
                )
            except BaseException:
                await asyncio.gather(
                    *(self._call(http, u, "/resume", optional=True) for u in self.engine_urls),
                    return_exceptions=True,
                )
                raise
            await self._all(http, "/resume", optional=True)
        self.served_version = version
        return time.monotonic() - t0

    async def update_lora(self, adapter_dir: Path, version: int, *, lora_name: str) -> float:
        """Load a PEFT adapter directory in place under ``lora_name`` on every engine (``/v1/load_lora_adapter``
        with ``load_inplace``; engines need ``--enable-lora`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``).
        Requests name ``lora_name`` as their model. Returns seconds; raises WeightUpdateError naming the URL."""
        t0 = time.monotonic()
        body = {"lora_name": lora_name, "lora_path": str(Path(adapter_dir).absolute()), "load_inplace": True}
        async with httpx.AsyncClient(timeout=self.timeout_s, headers=self._headers) as http:
            await self._all(http, "/v1/load_lora_adapter", json=body)
            await self._all(http, "/reset_prefix_cache", optional=True)
        self.served_version = version
        return time.monotonic() - t0

    async def served_versions(self) -> dict[str, str | None]:
        """Each engine's recorded weight version (``GET /weight_info``), None where unavailable."""
        out: dict[str, str | None] = {}
        async with httpx.AsyncClient(timeout=10.0, headers=self._headers) as http:
            for url in self.engine_urls:
                try:
                    resp = await http.get(url + "/weight_info")
                    out[url] = resp.json().get("weight_version") if resp.status_code == 200 else None
                except (httpx.HTTPError, ValueError):
                    out[url] = None
        return out


async def follow_broadcasts(
    run: RunDir,
    updater: WeightUpdater,
    *,
    after_step: int = -1,
    poll_s: float = 0.5,
    stop: asyncio.Event | None = None,
    on_update=None,
) -> None:
    """Poll ``run.broadcasts`` and load each newer STABLE broadcast (skipping intermediate ones when several
    landed since the last poll: only the newest matters). ``on_update(step, seconds)`` is called after each load.
    Returns when ``stop`` is set; WeightUpdateError propagates."""
    last = after_step
    while stop is None or not stop.is_set():
        found = newest_stable_broadcast(run)
        if found is not None and found[0] > last:
            step, path = found
            seconds = await updater.update(path, step)
            last = step
            if on_update is not None:
                on_update(step, seconds)
        await asyncio.sleep(poll_s)
