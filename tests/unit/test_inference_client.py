"""PolicyClient request/response handling and failure behaviour, WeightUpdater guards (no engine needed)."""

from __future__ import annotations

import asyncio
import http.server
import json
import threading
import time
import typing

import pytest
from local_engines import free_port

from toolkit.errors import ProviderError, SrlRolloutError
from toolkit.fsutil import write_marker
from toolkit.inference.client import PolicyClient, completion_payload, parse_completion
from toolkit.inference.weights import WeightUpdateError, WeightUpdater
from toolkit.run.layout import RunDir, newest_stable_broadcast
from toolkit.run.types import SamplingParams


def test_payload_asks_for_token_ids_and_sampled_logprobs():
    body = completion_payload(
        "m", [1, 2, 3], SamplingParams(temperature=0.7, top_k=None, max_tokens=9, stop_token_ids=[2], seed=5)
    )
    assert body["prompt"] == [1, 2, 3] and body["logprobs"] == 0 and body["return_token_ids"] is True
    assert body["top_k"] == 0 and body["max_tokens"] == 9 and body["stop_token_ids"] == [2] and body["seed"] == 5


def test_parse_completion_and_malformed_responses():
    data = {"choices": [{"token_ids": [4, 5], "logprobs": {"token_logprobs": [-1.0, -2.5]}, "finish_reason": "stop"}]}
    gen = parse_completion(data, policy_version=3)
    assert gen.token_ids == [4, 5] and gen.logprobs == [-1.0, -2.5] and gen.finish_reason == "stop"
    assert gen.policy_version == 3
    with pytest.raises(ProviderError):
        parse_completion({"choices": [{"text": "x"}]}, 0)
    bad = json.loads(json.dumps(data))
    bad["choices"][0]["token_ids"] = [4]
    with pytest.raises(ProviderError, match="1 token ids but 2 logprobs"):
        parse_completion(bad, 0)


def test_dead_endpoint_raises_provider_error_after_bounded_retries():
    port = free_port()  # nothing listens there

    async def go():
        async with PolicyClient(f"http://127.0.0.1:{port}", "m", timeout_s=2, max_retries=2, backoff_s=0.05) as c:
            await c.generate([1], SamplingParams(max_tokens=1), session_id="s")

    t0 = time.monotonic()
    with pytest.raises(ProviderError, match="after 3 attempts") as info:
        asyncio.run(go())
    assert time.monotonic() - t0 < 5
    assert isinstance(info.value, SrlRolloutError) and info.value.error_class == "ProviderError"


def test_updater_refuses_tied_broadcast_before_touching_engines(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"tie_word_embeddings": True}))
    updater = WeightUpdater([f"http://127.0.0.1:{free_port()}"])
    with pytest.raises(WeightUpdateError, match="tie_word_embeddings"):
        asyncio.run(updater.update(tmp_path, 1))


def test_updater_names_the_failing_engine(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(WeightUpdateError, match=url):
        asyncio.run(WeightUpdater([url], timeout_s=2).update(tmp_path, 1))


def test_the_reload_call_is_bounded_by_the_size_of_the_weights(tmp_path):
    # A sparse 3 GiB weights file: st_size counts, no disk is used.
    with open(tmp_path / "model.safetensors", "wb") as f:
        f.truncate(3 * 2**30)
    (tmp_path / "config.json").write_text("{}")

    calls = []

    class Recording(WeightUpdater):
        async def _call(self, http, url, path, **kw):
            calls.append((url, path, kw.get("timeout")))

    updater = Recording(["http://a", "http://b"], timeout_s=300.0, s_per_gib=120.0)
    assert updater.reload_timeout_s(tmp_path) == pytest.approx(300.0 + 3 * 120.0, abs=1e-3)
    asyncio.run(updater._reload_all(None, tmp_path))
    assert sorted(calls) == [
        ("http://a", "/collective_rpc", pytest.approx(660.0, abs=1e-3)),
        ("http://b", "/collective_rpc", pytest.approx(660.0, abs=1e-3)),
    ]
    assert WeightUpdater(["http://a"]).reload_timeout_s(tmp_path) == 300.0  # no per-GiB allowance unless given


def test_newest_stable_broadcast_skips_unmarked_and_temp_dirs(tmp_path):
    run = RunDir(tmp_path)
    assert newest_stable_broadcast(run) is None
    for step in (1, 3, 5):
        run.broadcast_step(step).mkdir(parents=True)
    write_marker(run.broadcast_step(1) / "STABLE")
    write_marker(run.broadcast_step(3) / "STABLE")
    (run.broadcasts / ".step_7.tmp-1-abc").mkdir()
    assert newest_stable_broadcast(run) == (3, run.broadcast_step(3))


def test_proxy_from_the_environment_is_resolved_once_per_endpoint(monkeypatch):
    from toolkit.inference.client import env_proxy_for

    for var in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(var, raising=False)
    assert env_proxy_for("http://node01:8000") is None
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.site:3128")
    monkeypatch.setenv("NO_PROXY", "localhost,.cluster.local")
    assert env_proxy_for("http://node01:8000") == "http://proxy.site:3128"
    assert env_proxy_for("http://gpu3.cluster.local:8000") is None
    assert env_proxy_for("https://node01:8000") is None  # no HTTPS_PROXY set


# -- a group's requests for one prompt go out as one request of n samples ----------------------------------------
class _Recorder(http.server.BaseHTTPRequestHandler):
    """A completions endpoint that records each request body and answers ``n`` distinct samples (choice i holds
    token 100 + i), listed in reverse index order as a server may; ``choices_short`` answers one sample fewer."""

    bodies: typing.ClassVar[list] = []
    choices_short = False
    status = 200

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        self.bodies.append(body)
        n = int(body.get("n") or 1) - (1 if self.choices_short else 0)
        choice = {"logprobs": {"token_logprobs": [-0.5]}, "finish_reason": "stop"}
        out = json.dumps({"choices": [{**choice, "index": i, "token_ids": [100 + i]} for i in range(n)][::-1]})
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out.encode())

    def log_message(self, *args):
        pass


@pytest.fixture
def recorder():
    handler = type("R", (_Recorder,), {"bodies": []})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", handler
    srv.shutdown()
    srv.server_close()


def _generate_all(url: str, calls: list[tuple[list[int], SamplingParams]], **client_kw):
    async def go():
        async with PolicyClient(url, "m", max_retries=0, **client_kw) as c:
            return await asyncio.gather(
                *(c.generate(p, s, session_id=f"s{i}") for i, (p, s) in enumerate(calls)), return_exceptions=True
            )

    return asyncio.run(go())


def test_a_groups_calls_for_one_prompt_go_out_as_one_request_of_n_samples(recorder):
    url, handler = recorder
    plain = SamplingParams(max_tokens=4)
    gens = _generate_all(url, [([1, 2], plain)] * 8 + [([3], plain)] * 2 + [([1, 2], SamplingParams(max_tokens=5))])
    bodies = sorted(handler.bodies, key=lambda b: (b["prompt"], b["max_tokens"]))
    assert [(b["prompt"], b.get("n", 1), b["max_tokens"]) for b in bodies] == [
        ([1, 2], 8, 4),
        ([1, 2], 1, 5),
        ([3], 2, 4),
    ]
    # every caller gets its own sample, none twice
    assert sorted(g.token_ids[0] for g in gens[:8]) == list(range(100, 108))
    assert sorted(g.token_ids[0] for g in gens[8:10]) == [100, 101] and gens[10].token_ids == [100]
    assert len({id(g) for g in gens}) == len(gens)


def test_seeded_calls_go_out_alone_so_a_seed_keeps_meaning_one_draw(recorder):
    url, handler = recorder
    _generate_all(url, [([1, 2], SamplingParams(max_tokens=4, seed=7))] * 3)
    assert [(b.get("n", 1), b["seed"]) for b in handler.bodies] == [(1, 7)] * 3


def test_a_response_with_too_few_samples_fails_each_caller_with_its_own_error(recorder):
    url, handler = recorder
    handler.choices_short = True
    errs = _generate_all(url, [([1], SamplingParams(max_tokens=4))] * 3)
    assert all(isinstance(e, ProviderError) and "asked for 3 completions" in str(e) for e in errs)
    assert len({id(e) for e in errs}) == 3


def test_a_caller_cancelled_while_waiting_leaves_the_others_their_samples(recorder):
    url, handler = recorder

    async def go():
        async with PolicyClient(url, "m", max_retries=0) as c:
            s = SamplingParams(max_tokens=4)
            tasks = [asyncio.ensure_future(c.generate([1], s, session_id=f"s{i}")) for i in range(3)]
            await asyncio.sleep(0)  # all three joined; the request goes out on the next pass
            tasks[0].cancel()
            return await asyncio.gather(*tasks, return_exceptions=True)

    out = asyncio.run(go())
    assert isinstance(out[0], asyncio.CancelledError)
    assert sorted(g.token_ids[0] for g in out[1:]) == [101, 102] and handler.bodies[0]["n"] == 3
