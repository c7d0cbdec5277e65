"""Readiness of a deployment: an engine's /health, and telling the orchestrator through the run directory.

The launcher writes ``<run>/control/inference_ready.json`` once every engine (and the router) answers; the
orchestrator, possibly on another node, reads it to learn the URLs. A stale file from an earlier attempt is removed
before engines start, so a reader never picks up URLs of dead engines.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Mapping
from typing import Any

import httpx

from toolkit.fsutil import atomic_write_json
from toolkit.run.layout import RunDir


def is_healthy(url: str, *, timeout_s: float = 2.0) -> bool:
    """True when ``GET <url>/health`` answers 200 within ``timeout_s`` seconds."""
    try:
        return httpx.get(f"{url.rstrip('/')}/health", timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False


def write_ready(run: RunDir, info: Mapping[str, Any]) -> None:
    """Atomically write the readiness file ``run.inference_ready``.

    ``info`` keys (``toolkit.placement.runtime.ready_info``): ``base_url`` (what clients call: the router,
    or the only engine), ``router_url`` (or None), ``engine_urls`` (all engines, for admin calls), ``roles``
    (engine URL -> "engine" | "prefill" | "decode"), ``model`` (served model name), ``policy_version``.
    A ``written_at`` UNIX time is added.
    """
    run.control.mkdir(parents=True, exist_ok=True)
    atomic_write_json(run.inference_ready, {**info, "written_at": time.time()})


def current_ready(run: RunDir) -> dict[str, Any] | None:
    """The readiness record as it is now, without waiting: None when there is none, or the file is unreadable or
    not a record (another program's file)."""
    try:
        data = json.loads(run.inference_ready.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def clear_ready(run: RunDir) -> None:
    """Remove a readiness file left by an earlier attempt (its URLs may point at dead engines)."""
    run.inference_ready.unlink(missing_ok=True)


def read_ready(
    run: RunDir, timeout_s: float, *, interval_s: float = 0.5, should_stop: Callable[[], bool] | None = None
) -> dict[str, Any] | None:
    """Wait up to ``timeout_s`` seconds for the readiness file and return its content.

    Returns None as soon as ``should_stop()`` is true (a stop request during engine start-up: the launcher then
    never publishes readiness, and waiting out the whole start-up timeout would keep a Ctrl-C hanging for minutes).
    Raises TimeoutError naming the file when it does not appear in time.
    """
    t0 = time.monotonic()
    while True:
        # Not there yet; or partial, which only a foreign writer could leave (it is written atomically): keep waiting.
        with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):
            return json.loads(run.inference_ready.read_text())
        if should_stop is not None and should_stop():
            return None
        if time.monotonic() - t0 > timeout_s:
            raise TimeoutError(f"inference not ready after {timeout_s:.0f} s: {run.inference_ready} missing")
        time.sleep(interval_s)
