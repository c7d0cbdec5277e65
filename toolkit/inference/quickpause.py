"""``POST /pause?mode=keep`` without vLLM's courtesy sleep: the first step of every live weight update.

vLLM 0.32's ``AsyncLLM.pause_generation`` asks the engine core to pause its scheduler and then sleeps 20 ms, so that
final outputs of requests that finished just before the pause reach their callers before the call returns (its own
comment: not needed for correctness). With ``mode=keep`` nothing is finished by the pause (queued and running
requests are frozen and continue after ``/resume``), and srl tags each completion with every weight version seen
between its arrival and its answer (:mod:`toolkit.inference.versions`), so the sleep buys srl nothing. On a 2-core
host it was 20 of the 25 ms of each pause and 40% of a whole weight update (about 50 ms) on every trainer step.

:class:`QuickPause` answers that one call itself, doing what vLLM's route does minus the sleep: clear the
multi-modal cache when ``clear_cache`` (default true, as vLLM's route) and pause the engine core's scheduler with
``mode="keep"`` and that ``clear_cache``; its answer says ``"srl_quick_pause": true``. Every other request, and the
same route on an engine client without these methods (another vLLM version), goes to vLLM unchanged. It sits inside
the admin guard (:mod:`toolkit.inference.guard`), so only the run's own updater reaches it.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qs

from .versions import route_path

PAUSE_PATH = "/pause"
# The spellings of a boolean query value FastAPI accepts; another value goes to vLLM, which refuses it.
_BOOLS = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False, "off": False}


class QuickPause:
    """Pure ASGI middleware around the engine's app ``app`` (see module docstring)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope.get("method") == "POST" and route_path(scope) == PAUSE_PATH:
            query = parse_qs(scope.get("query_string", b"").decode())
            engine = getattr(getattr(scope.get("app"), "state", None), "engine_client", None)
            core = getattr(engine, "engine_core", None)
            clear = query.get("clear_cache", ["true"])[-1].lower()
            if query.get("mode") == ["keep"] and clear in _BOOLS and hasattr(core, "pause_scheduler_async"):
                clear_cache = _BOOLS[clear]  # vLLM's route takes the same query value, default true
                renderer = getattr(engine, "renderer", None)
                if clear_cache and hasattr(renderer, "clear_mm_cache_async"):
                    await renderer.clear_mm_cache_async()
                await core.pause_scheduler_async(mode="keep", clear_cache=clear_cache)
                await _reply(send, {"status": "paused", "srl_quick_pause": True})
                return
        await self.app(scope, receive, send)


async def _reply(send: Any, content: dict) -> None:
    body = json.dumps(content).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
