"""The weight update's pause without vLLM's courtesy sleep: which requests QuickPause answers itself and which it
passes to vLLM. Against real engines (the pause, a reload with requests in flight, the admin guard in front):
tests/integration/test_inference_engine.py, test_faults_admin_endpoints.py."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

from toolkit.inference.guard import AdminGuard
from toolkit.inference.quickpause import QuickPause


class _Core:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    async def pause_scheduler_async(self, mode: str = "abort", clear_cache: bool = True) -> None:
        self.calls.append(("pause", mode, clear_cache))


class _Renderer:
    def __init__(self, core: _Core) -> None:
        self.core = core

    async def clear_mm_cache_async(self) -> None:
        self.core.calls.append(("clear_mm_cache",))


def _call(app, path: str, query: bytes, engine, method: str = "POST", headers=()) -> tuple[list[dict], list[str]]:
    """Run one HTTP request through ``app``; returns what was sent and which inner app saw it."""
    seen: list[str] = []

    async def vllm(scope, receive, send):  # vLLM's own routes (with their 20 ms sleep)
        seen.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b'{"status": "from vllm"}'})

    sent: list[dict] = []

    async def send(msg):
        sent.append(msg)

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "root_path": "",
        "query_string": query,
        "headers": list(headers),
        "app": SimpleNamespace(state=SimpleNamespace(engine_client=engine)),
    }
    asyncio.run(app(vllm)(scope, receive, send))
    return sent, seen


def test_a_keep_pause_goes_to_the_engine_core_directly_and_everything_else_to_vllm() -> None:
    core = _Core()
    engine = SimpleNamespace(engine_core=core, renderer=_Renderer(core))
    sent, seen = _call(QuickPause, "/pause", b"mode=keep", engine)
    assert seen == [] and core.calls == [("clear_mm_cache",), ("pause", "keep", True)]
    assert sent[0]["status"] == 200 and json.loads(sent[1]["body"]) == {"status": "paused", "srl_quick_pause": True}
    core.calls.clear()
    _call(QuickPause, "/pause", b"mode=keep&clear_cache=false", engine)
    assert core.calls == [("pause", "keep", False)]  # no cache cleared, as vLLM's route with that value
    others = (
        ("/pause", b"mode=abort", "POST"),
        ("/pause", b"", "POST"),
        ("/resume", b"", "POST"),
        ("/pause", b"mode=keep", "GET"),
        ("/pause", b"mode=keep&clear_cache=maybe", "POST"),  # vLLM refuses that value itself
        ("/v1/completions", b"", "POST"),
    )
    for path, query, method in others:
        core.calls.clear()
        _sent, seen = _call(QuickPause, path, query, engine, method=method)
        assert seen == [path] and core.calls == [], (path, query, method)
    # an engine client without these methods (another vLLM version): vLLM's own route answers
    _sent, seen = _call(QuickPause, "/pause", b"mode=keep", SimpleNamespace())
    assert seen == ["/pause"]


def test_the_quick_pause_sits_behind_the_admin_guard() -> None:
    core = _Core()
    engine = SimpleNamespace(engine_core=core, renderer=_Renderer(core))
    guarded = lambda app: AdminGuard(app, token="s3cret")
    sent, seen = _call(guarded, "/pause", b"mode=keep", engine)
    assert sent[0]["status"] == 401 and core.calls == [] and seen == []
    sent, seen = _call(guarded, "/pause", b"mode=keep", engine, headers=[(b"x-srl-admin-token", b"s3cret")])
    assert sent[0]["status"] == 200 and core.calls[-1] == ("pause", "keep", True) and seen == []
