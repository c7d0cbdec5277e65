"""PolicyClient request/response handling and failure behaviour, WeightUpdater guards (no engine needed)."""

from __future__ import annotations

import asyncio
import json
import time

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
