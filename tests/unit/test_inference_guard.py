"""The engines' admin guard (issue 9 item 7): the ASGI middleware, the run token's helpers, and the real
WeightUpdater talking through the guard over HTTP (a uvicorn server in a thread; no vLLM needed)."""

from __future__ import annotations

import asyncio
import importlib
import json
import stat

import pytest
from asgi_server import ServedApp
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from toolkit.engines import admin_token as at
from toolkit.engines.commands import GUARD_MIDDLEWARE, engine_command
from toolkit.inference.guard import OPEN_PATHS, AdminGuard, is_open
from toolkit.inference.weights import WeightUpdateError, WeightUpdater
from toolkit.run.layout import RunDir

TOKEN = "tok-" + "x" * 40
ADMIN = [
    "/collective_rpc",
    "/pause",
    "/resume",
    "/reset_prefix_cache",
    "/update_weight_version",
    "/sleep",
    "/wake_up",
    "/server_info",
    "/weight_info",
    "/update_weights",
    "/v1/load_lora_adapter",
    "/v1/unload_lora_adapter",
    "/start_profile",
    "/inference/v1/generate",
    "/docs",
    "/openapi.json",
    "/v1/completions/",
    "/v1/../pause",
    "//pause",
    "/metricsx",
    "/",
]
OPENAI = [
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/models",
    "/health",
    "/metrics",
    "/metrics/",
    "/tokenize",
    "/version",
]


def _app(seen: list[tuple[str, str, dict]]) -> Starlette:
    """Stands in for vLLM's app behind the guard: answers 200 on every path and records what reached it."""

    async def anything(request):
        body = await request.body()
        seen.append((request.method, request.url.path, json.loads(body) if body else {}))
        return JSONResponse({"ok": True, "path": request.url.path})

    return Starlette(routes=[Route("/{path:path}", anything, methods=["GET", "POST", "DELETE"])])


def _client(token: str | None, seen: list) -> TestClient:
    app = _app(seen)
    app.add_middleware(AdminGuard, token=token)  # how vLLM's --middleware loads a class (without kwargs)
    return TestClient(app)


def test_open_routes_pass_without_token_and_admin_routes_need_it():
    seen: list = []
    c = _client(TOKEN, seen)
    for path in OPENAI:
        assert c.post(path, json={}).status_code == 200, path
    assert [p for _, p, _ in seen] == OPENAI
    seen.clear()
    for path in ADMIN:
        for headers in (
            {},
            {at.ADMIN_TOKEN_HEADER: "wrong"},
            {at.ADMIN_TOKEN_HEADER: TOKEN[:-1]},
            {at.ADMIN_TOKEN_HEADER: TOKEN + "x"},
            {"Authorization": f"Bearer {TOKEN}"},
        ):
            r = c.post(path, json={"method": "reload_weights"}, headers=headers)
            assert r.status_code == 401, (path, headers, r.status_code)
            assert TOKEN not in r.text and r.json()["error"]["type"] == "srl_admin_guard"
            assert at.ADMIN_TOKEN_HEADER in r.json()["error"]["message"]
    assert seen == []  # nothing reached the app
    for path in ["/collective_rpc", "/pause", "/v1/load_lora_adapter"]:
        r = c.post(path, json={"k": 1}, headers={at.ADMIN_TOKEN_HEADER: TOKEN})
        assert r.status_code == 200 and r.json()["path"] == path
    assert [(p, b) for _, p, b in seen] == [
        (p, {"k": 1}) for p in ["/collective_rpc", "/pause", "/v1/load_lora_adapter"]
    ]
    assert c.get("/weight_info", headers={at.ADMIN_TOKEN_HEADER.lower(): TOKEN}).status_code == 200


def test_engine_without_token_refuses_admin_routes_entirely(monkeypatch):
    monkeypatch.delenv(at.ADMIN_TOKEN_ENV, raising=False)
    seen: list = []
    c = _client(None, seen)  # token from the (empty) environment: fail closed
    assert c.get("/v1/models").status_code == 200
    for headers in ({}, {at.ADMIN_TOKEN_HEADER: ""}, {at.ADMIN_TOKEN_HEADER: "anything"}):
        r = c.post("/collective_rpc", json={}, headers=headers)
        assert r.status_code == 403 and at.ADMIN_TOKEN_ENV in r.json()["error"]["message"]
    assert [p for _, p, _ in seen] == ["/v1/models"]


def test_token_comes_from_the_environment_at_construction(monkeypatch):
    monkeypatch.setenv(at.ADMIN_TOKEN_ENV, TOKEN)
    c = _client(None, [])
    assert c.post("/pause", headers={at.ADMIN_TOKEN_HEADER: TOKEN}).status_code == 200
    assert c.post("/pause", headers={at.ADMIN_TOKEN_HEADER: "nope"}).status_code == 401
    assert TOKEN not in repr(AdminGuard(None))


def _raw_call(guard_token: str | None, scope: dict) -> tuple[list[dict], list[str]]:
    """Call the guard as a raw ASGI app; returns (messages it sent, paths that reached the inner app)."""
    reached: list[str] = []
    sent: list[dict] = []

    async def inner(scope, receive, send):
        reached.append(scope.get("path", scope["type"]))

    async def receive():
        return {"type": "http.request", "body": b""}

    async def send(msg):
        sent.append(msg)

    asyncio.run(AdminGuard(inner, token=guard_token)(scope, receive, send))
    return sent, reached


def test_raw_asgi_root_path_websocket_and_lifespan():
    hdr = [(at.ADMIN_TOKEN_HEADER.lower().encode(), TOKEN.encode())]
    http = {"type": "http", "method": "POST", "root_path": "/proxy", "headers": []}
    assert _raw_call(TOKEN, {**http, "path": "/proxy/v1/models"}) == ([], ["/proxy/v1/models"])
    sent, reached = _raw_call(TOKEN, {**http, "path": "/proxy/pause"})
    assert reached == [] and sent[0]["status"] == 401 and TOKEN.encode() not in sent[1]["body"]
    assert _raw_call(TOKEN, {**http, "path": "/proxy/pause", "headers": hdr})[1] == ["/proxy/pause"]
    sent, reached = _raw_call(TOKEN, {"type": "websocket", "path": "/v1/realtime", "headers": []})
    assert reached == [] and sent == [{"type": "websocket.close", "code": 1008, "reason": sent[0]["reason"]}]
    assert _raw_call(None, {"type": "lifespan"}) == ([], ["lifespan"])  # start-up events pass untouched


def test_open_list_is_exact_and_small():
    assert all(p.startswith("/") for p in OPEN_PATHS)
    assert not any(is_open(p) for p in ADMIN)
    assert all(is_open(p) for p in OPENAI)


def test_engine_command_loads_the_guard_and_the_import_path_is_a_class(tmp_path):
    argv = engine_command(
        model_path=tmp_path,
        host="127.0.0.1",
        port=8000,
        vllm_args={"middleware": "x.Y"},
        tp=1,
        dp=1,
        served_model_name="m",
        kv_role=None,
        kv_connector=None,
        kv_extra=None,
    )
    assert argv[argv.index(GUARD_MIDDLEWARE) - 1] == "--middleware"
    assert argv.count("--middleware") == 2  # the user's own middleware is kept
    assert not any(at.ADMIN_TOKEN_ENV in a for a in argv)
    module, name = GUARD_MIDDLEWARE.rsplit(".", 1)
    assert getattr(importlib.import_module(module), name) is AdminGuard


def test_token_helpers(tmp_path, monkeypatch):
    a, b = at.new_admin_token(), at.new_admin_token()
    assert a != b and len(a) >= 43
    monkeypatch.setenv(at.ADMIN_TOKEN_ENV, a)
    assert at.admin_token_from_env() == a
    at.restore_admin_token(None)
    assert at.admin_token_from_env() is None
    at.restore_admin_token(b)
    assert at.admin_token_from_env() == b
    run = RunDir(tmp_path / "r")
    assert at.read_token_file(run.admin_token_file) is None
    fresh = at.for_local_deployment(run, publish=False)
    assert not run.admin_token_file.exists()
    pub = at.for_local_deployment(run, publish=True)
    assert pub != fresh and at.read_token_file(run.admin_token_file) == pub
    assert stat.S_IMODE(run.admin_token_file.stat().st_mode) == 0o600
    assert at.for_local_deployment(run, publish=True) == pub  # a requeued deployment keeps its token
    assert [p.name for p in run.launcher.iterdir()] == ["admin_token"]  # no temp file left


class _Server(ServedApp):
    """uvicorn serving the guarded stand-in app in a thread (real HTTP for the real WeightUpdater)."""

    def __init__(self, token: str | None):
        self.seen: list = []
        app = _app(self.seen)
        app.add_middleware(AdminGuard, token=token)
        super().__init__(app)


def test_weight_updater_sends_the_token_and_fails_clearly_without_it(tmp_path, monkeypatch):
    monkeypatch.delenv(at.ADMIN_TOKEN_ENV, raising=False)
    srv = _Server(TOKEN)
    with srv as url:
        updater = WeightUpdater([url], timeout_s=5, admin_token=TOKEN)
        asyncio.run(updater.update(tmp_path, 3))
        assert asyncio.run(updater.served_versions()) == {url: None}  # /weight_info reached (no such field)
        n = len(srv.seen)
        seen = [p for _, p, _ in srv.seen if p != "/server_info"]  # KV store lookup: concurrent with the pause
        assert (
            seen
            == ["/pause", "/collective_rpc", "/reset_prefix_cache", "/update_weight_version", "/resume", "/weight_info"]
            and len(srv.seen) == len(seen) + 1
        )
        rpc = next(b for _, p, b in srv.seen if p == "/collective_rpc")
        assert rpc == {"method": "reload_weights", "kwargs": {"weights_path": str(tmp_path.absolute())}}
        for bad in ("wrong", None):  # None: no SRL_ADMIN_TOKEN in this process's environment
            with pytest.raises(WeightUpdateError, match="HTTP 401") as info:
                asyncio.run(WeightUpdater([url], timeout_s=5, admin_token=bad).update(tmp_path, 4))
            assert TOKEN not in str(info.value)
        assert [p for _, p, _ in srv.seen[n:]] == []  # refused calls never reached the app (not even /resume)
        monkeypatch.setenv(at.ADMIN_TOKEN_ENV, TOKEN)  # the launcher's environment is the default source
        asyncio.run(WeightUpdater([url], timeout_s=5).update(tmp_path, 5))
        assert srv.seen[-2][2] == {"new_version": "5"} and srv.seen[-1][1] == "/resume"
