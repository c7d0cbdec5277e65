"""Engine restarts (issue 9 item 2): the launcher's restart budget, the orchestrator's engine states, the policy
client's serving gate and the rollout timeout that does not count an inference outage. No engine needed: the gate
is exercised against a real local HTTP server that answers like vLLM's /v1/completions."""

from __future__ import annotations

import asyncio
import http.server
import json
import threading
import time

import pytest
from local_engines import free_port

from toolkit.config.model import InferenceConfig
from toolkit.envs.rollout import wait_excluding_outage
from toolkit.errors import ProviderError
from toolkit.inference.client import PolicyClient
from toolkit.launch.supervisor import RestartBudget, is_restartable
from toolkit.orchestrator.engines import (
    DOWN,
    OK,
    RESTARTED,
    Probe,
    expected_versions,
    next_state,
    provider_retry_budget_s,
)
from toolkit.run.types import SamplingParams


# -- launcher restart budget -----------------------------------------------------------------------------------
def test_budget_allows_max_restarts_then_refuses():
    b = RestartBudget(2, None)
    assert b.try_restart(0.0) and b.try_restart(1.0)
    assert not b.try_restart(2.0)
    assert b.used(2.0) == 2  # a refused restart is not recorded


def test_budget_window_forgets_old_restarts():
    b = RestartBudget(2, window_s=100.0)
    assert b.try_restart(0.0) and b.try_restart(50.0)
    assert not b.try_restart(99.0)
    assert b.try_restart(100.0)  # the restart at 0 s left the window
    assert b.used(100.0) == 2
    assert not b.try_restart(120.0)


def test_zero_restarts_never_restarts_and_only_engines_restart():
    assert not RestartBudget(0, 3600.0).try_restart(0.0)
    assert is_restartable("inference")
    assert not any(is_restartable(r) for r in ("trainer", "orchestrator", "router"))


def test_config_defaults_and_bounds():
    cfg = InferenceConfig()
    assert cfg.max_restarts >= 1 and cfg.restart_window_s and cfg.restart_window_s > 0
    with pytest.raises(ValueError):
        InferenceConfig(max_restarts=-1)
    with pytest.raises(ValueError):
        InferenceConfig(restart_window_s=0)
    assert InferenceConfig(max_restarts=0, restart_window_s=None).max_restarts == 0


def test_retry_budget_outlasts_one_restart_only_when_restarts_are_on():
    assert provider_retry_budget_s(900.0, 2) > 900.0
    assert provider_retry_budget_s(900.0, 0) is None


# -- orchestrator engine states --------------------------------------------------------------------------------
def test_engine_states():
    assert expected_versions(0) == {"default", "base", "0"} and expected_versions(3) == {"3"}
    assert next_state(OK, Probe(True, "3"), 3) == OK
    assert next_state(OK, Probe(True, None), 3) == OK  # no /weight_info route: only a DOWN phase tells
    assert next_state(OK, Probe(False), 3) == DOWN
    assert next_state(DOWN, Probe(None), 3) == DOWN  # bound but not serving yet: unchanged
    assert next_state(OK, Probe(None), 3) == OK  # busy: unchanged, never a false alarm
    assert next_state(DOWN, Probe(True, "3"), 3) == RESTARTED  # back after an outage: weights unknown
    assert next_state(OK, Probe(True, "default"), 3) == RESTARTED  # restarted between two probes
    assert next_state(OK, Probe(True, "default"), 0) == OK  # base model is version 0
    assert next_state(RESTARTED, Probe(False), 3) == DOWN


# -- policy client serving gate --------------------------------------------------------------------------------
class _Completions(http.server.BaseHTTPRequestHandler):
    delay_s = 0.0

    def do_POST(self):
        n = int(json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0)))).get("n") or 1)
        time.sleep(self.delay_s)
        choice = {"token_ids": [7], "logprobs": {"token_logprobs": [-0.5]}, "finish_reason": "length"}
        body = json.dumps({"choices": [{**choice, "index": i} for i in range(n)]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    handler = type("H", (_Completions,), {"delay_s": 0.0})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv, handler
    srv.shutdown()
    srv.server_close()


def test_held_gate_delays_requests_until_release(server):
    srv, _ = server

    async def go():
        async with PolicyClient(f"http://127.0.0.1:{srv.server_port}", "m", timeout_s=5, retry_budget_s=10) as c:
            c.hold()
            task = asyncio.create_task(c.generate([1], SamplingParams(max_tokens=1), session_id="s"))
            await asyncio.sleep(0.3)
            assert not task.done() and c.held
            c.policy_version = 4  # restored before the gate opens
            c.release()
            gen = await asyncio.wait_for(task, 5)
            return gen, c.outage_seconds()

    gen, held = asyncio.run(go())
    assert gen.token_ids == [7] and gen.policy_version == 4  # tagged when sent, after the restore
    assert 0.25 < held < 60  # held from hold() to release(): at least the 0.3 s slept, however slow the machine


def _first_answer_held() -> type:
    """A fresh handler class that answers its first request only once its ``answer`` event is set (``received``:
    that request arrived; ``answered``: its answer was sent); ``requests`` counts every request."""

    class Handler(_Completions):
        received, answer, answered = threading.Event(), threading.Event(), threading.Event()
        requests = 0

        def do_POST(self):
            cls = type(self)
            cls.requests += 1
            first = cls.requests == 1
            if first:
                cls.received.set()
                cls.answer.wait(60)
            super().do_POST()
            if first:
                cls.answered.set()

    return Handler


def test_response_in_flight_when_the_gate_closes_is_discarded_and_resent():
    handler = _first_answer_held()
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()

    async def go():
        async with PolicyClient(
            f"http://127.0.0.1:{srv.server_port}", "m", timeout_s=60, retry_budget_s=120, backoff_s=0.01
        ) as c:
            task = asyncio.create_task(c.generate([1], SamplingParams(max_tokens=1), session_id="s"))
            assert await asyncio.to_thread(handler.received.wait, 60)  # the request is in flight
            c.hold()
            handler.answer.set()
            # Its response arrives while the gate is closed, from an epoch that is no longer trusted.
            assert await asyncio.to_thread(handler.answered.wait, 60)
            await asyncio.sleep(0.2)  # lets the client read it; the task cannot end while the gate is closed
            assert not task.done()
            c.release()
            return await asyncio.wait_for(task, 60)

    try:
        assert asyncio.run(go()).token_ids == [7]
    finally:
        srv.shutdown()
        srv.server_close()
    assert handler.requests == 2  # answered by the second request, after the release


def test_retry_budget_covers_an_endpoint_that_comes_back():
    port = free_port()  # nothing listens yet: connection refused, as while an engine restarts
    srv_box = {}

    def start_later():
        time.sleep(0.8)
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), _Completions)
        srv_box["srv"] = srv
        srv.serve_forever()

    threading.Thread(target=start_later, daemon=True).start()

    async def go():
        async with PolicyClient(
            f"http://127.0.0.1:{port}", "m", timeout_s=5, max_retries=1, backoff_s=0.1, retry_budget_s=20
        ) as c:
            return await c.generate([1], SamplingParams(max_tokens=1), session_id="s")

    try:
        assert asyncio.run(go()).token_ids == [7]  # max_retries alone (1) would have given up
    finally:
        if "srv" in srv_box:
            srv_box["srv"].shutdown()
            srv_box["srv"].server_close()


def test_gate_held_past_the_budget_raises_provider_error():
    async def go():
        async with PolicyClient(f"http://127.0.0.1:{free_port()}", "m", timeout_s=5, retry_budget_s=0.5) as c:
            c.hold()
            await c.generate([1], SamplingParams(max_tokens=1), session_id="s")

    with pytest.raises(ProviderError, match="still unavailable"):
        asyncio.run(go())


# -- rollout timeout without the outage ------------------------------------------------------------------------
class _Gate:
    """Stands in for the policy client's serving gate: ``outage_seconds`` grows while it is held, as the client's
    does while an engine restarts (injects the outage)."""

    def __init__(self) -> None:
        self.total, self.since = 0.0, None

    def hold(self) -> None:
        self.since = time.monotonic()

    def release(self) -> None:
        self.total += time.monotonic() - self.since
        self.since = None

    def outage_seconds(self) -> float:
        return self.total + (time.monotonic() - self.since if self.since is not None else 0.0)


def test_rollout_timeout_does_not_count_an_inference_outage():
    async def work(gate: _Gate | None, own_s: float, outage_s: float) -> str:
        await asyncio.sleep(own_s)
        if outage_s:  # the rollout waits behind the closed gate while an engine restarts
            gate.hold()
            await asyncio.sleep(outage_s)
            gate.release()
        return "done"

    # The outage is the time the work really spent behind the gate (from inside the event loop, however late the
    # loop started or the sleep ended): 0.1 s of own time and a 0.5 s outage under a 0.4 s timeout pass, though the
    # whole takes more than 0.6 s, which a timeout counting the outage would have ended.
    gate = _Gate()
    assert asyncio.run(wait_excluding_outage(work(gate, 0.1, 0.5), 0.4, gate)) == "done"
    assert gate.total >= 0.5
    gate = _Gate()
    with pytest.raises(asyncio.TimeoutError):  # 0.6 s of own time: no outage excuses it
        asyncio.run(wait_excluding_outage(work(gate, 0.6, 0.0), 0.4, gate))
    with pytest.raises(asyncio.TimeoutError):
        asyncio.run(wait_excluding_outage(work(None, 0.6, 0.0), 0.4, object()))  # no gate: a plain timeout


def test_a_version_tolerated_at_start_is_not_taken_for_a_restart():
    assert next_state(OK, Probe(True, "5"), 0, tolerated="5") == OK
    assert next_state(OK, Probe(True, "default"), 0, tolerated="5") == OK
    assert next_state(OK, Probe(True, "4"), 0, tolerated="5") == RESTARTED


# -- the watch end to end, against an HTTP stand-in for an engine that crashes and restarts ----------------------
class _EngineStandIn(http.server.BaseHTTPRequestHandler):
    """Answers the routes the watch and WeightUpdater use, like vLLM in dev mode; state on the server object."""

    def _reply(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._reply({"weight_version": self.server.version})

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)) or 0)
        payload = json.loads(body) if body else {}
        if self.path == "/collective_rpc":
            self.server.loaded.append(payload["kwargs"]["weights_path"])
        if self.path == "/update_weight_version":
            self.server.version = payload["new_version"]
        self._reply({})

    def log_message(self, *args):
        pass


def _serve(port: int, version: str) -> http.server.ThreadingHTTPServer:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), _EngineStandIn)
    srv.version, srv.loaded = version, []
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def test_watch_holds_while_down_and_restores_newest_stable_before_release(tmp_path):
    import httpx

    from toolkit.fsutil import write_marker
    from toolkit.inference.weights import WeightUpdater
    from toolkit.orchestrator.engines import EngineWatch
    from toolkit.orchestrator.policy import PolicyTracker
    from toolkit.run.layout import RunDir

    run = RunDir(tmp_path)
    for step in (1, 3):
        run.broadcast_step(step).mkdir(parents=True)
        write_marker(run.broadcast_step(step) / "STABLE")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    srv = _serve(port, "3")

    async def go():
        nonlocal srv
        client = PolicyClient(url, "m", timeout_s=5, retry_budget_s=10)
        tracker = PolicyTracker(run, client, WeightUpdater([url], timeout_s=5), served_version=3)
        watch = EngineWatch(client, tracker, [url], headers={}, probe_timeout_s=1.0)
        async with httpx.AsyncClient() as http_client:
            await watch.check(http_client)
            assert not client.held and watch.states[url] == OK
            srv.shutdown()
            srv.server_close()  # the engine dies: connection refused
            await watch.check(http_client)
            assert client.held and watch.states[url] == DOWN and not tracker.engines_ok
            assert await tracker.refresh() == 3  # the tracker leaves the engines to the watch meanwhile
            run.broadcast_step(4).mkdir(parents=True)
            write_marker(run.broadcast_step(4) / "STABLE")  # the trainer went on meanwhile
            srv = _serve(port, "default")  # restarted with the base model
            await watch.check(http_client)
        await client.aclose()
        return client, tracker, watch

    try:
        client, tracker, watch = asyncio.run(go())
    finally:
        srv.shutdown()
        srv.server_close()
    assert srv.loaded == [str(run.broadcast_step(4).absolute())] and srv.version == "4"
    assert not client.held and tracker.served_version == 4 and client.policy_version == 4
    assert watch.states[url] == OK
    record = json.loads(run.policy_reloads.read_text().splitlines()[-1])
    assert record["restore"] is True and record["engines"] == {url: "4"}
