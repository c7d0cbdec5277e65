"""Env workers that run verifiers' own rollout (``toolkit.envs.traces``) for an environment the plain chat loop
cannot play: ``codebook-lookup`` (tests/fixtures/vf_envs), whose task serves a tool server. Real worker
processes, verifiers' ``null`` harness program (run with the job's interpreter, no package index), verifiers'
interception server and the task's MCP tool server; the model turns come back to this process as callbacks and
are answered by a scripted policy (the vLLM path is tests/integration/test_rl_tool_env.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from prereqs import need_module

need_module("verifiers.v1")
need_module("transformers")

from toolkit.envs.runtime import EnvRuntime
from toolkit.errors import ProviderError
from toolkit.run.types import Generation, SamplingParams

VF_ENVS = Path(__file__).resolve().parents[1] / "fixtures" / "vf_envs"
TOOL_RESPONSE = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.DOTALL)

pytestmark = pytest.mark.slow  # worker processes import verifiers; every episode starts a harness program


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from toolkit.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture
def vf_envs_on_path(monkeypatch):
    # The worker resolves the id there, and verifiers starts the tool server as `python -m codebook_lookup`.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(VF_ENVS), os.environ.get("PYTHONPATH")])))


def env_cfg(max_total_tokens=None, taskset_id="codebook-lookup", **harness):
    return SimpleNamespace(
        name="codebook",
        env_name="codebook",
        taskset=SimpleNamespace(id=taskset_id, split="train", seed=0, select=None, model_extra={}),
        harness=SimpleNamespace(id="default", runtime=SimpleNamespace(type="subprocess"), **harness),
        timeout=SimpleNamespace(setup=60, rollout=120, finalize=60, scoring=60),
        max_turns=4,
        max_total_tokens=max_total_tokens,
        retries=0,
        pool=SimpleNamespace(type="static", max_workers=1, multiplex=1),
        address=None,
    )


def runtime(cfg, model_dir) -> EnvRuntime:
    """The env's runtime with the tiny model and the Hermes renderer (tool schemas in the prompt)."""
    return EnvRuntime(cfg, model_path=model_dir, renderer_cfg=SimpleNamespace(name="hermes", import_path=None), seed=0)


class ToolPolicy:
    """Turn 1: a Hermes tool call for the animal in the prompt; then the tool's answer. Versions count up."""

    def __init__(self, renderer, fail: bool = False) -> None:
        self.renderer, self.fail, self.calls, self.prompt_lens = renderer, fail, [], []

    async def generate(self, prompt_ids, sampling, *, session_id):
        if self.fail:
            raise ProviderError("engine unreachable after the retry budget (injected)")
        text = self.renderer.decode(prompt_ids)
        responses = TOOL_RESPONSE.findall(text)
        if responses:
            reply = responses[-1]
        else:
            animal = re.findall(r"code word for (\w+)", text)[-1]
            reply = (
                "<tool_call>" + json.dumps({"name": "codebook_lookup", "arguments": {"key": animal}}) + "</tool_call>"
            )
        ids = self.renderer.encode(reply) + [self.renderer.stop_token_ids[0]]
        self.calls.append((session_id, sampling.max_tokens))
        self.prompt_lens.append(len(prompt_ids))
        cut = len(ids) > sampling.max_tokens  # as an engine does: at most max_tokens, then finish by length
        ids = ids[: sampling.max_tokens]
        return Generation(ids, [-0.25] * len(ids), "length" if cut else "stop", policy_version=3 + len(self.calls))


def test_a_tool_env_runs_through_verifiers_rollout_with_model_calls_from_the_worker(model_dir, vf_envs_on_path):
    from toolkit.models.renderer import HermesRenderer

    renderer = HermesRenderer(model_dir)

    async def go():
        rt = runtime(env_cfg(), model_dir)
        try:
            await rt.start()
            assert rt.mode == "trace" and rt.num_examples == 4
            policy = ToolPolicy(renderer)
            group = await rt.run_group(1, 2, client=policy, sampling=SamplingParams(max_tokens=256))
            failing = await rt.run_group(0, 1, client=ToolPolicy(renderer, fail=True), sampling=SamplingParams())
            return rt.task_ids, group, failing, policy
        finally:
            await rt.aclose()

    task_ids, group, failing, policy = asyncio.run(go())
    assert len(policy.calls) == 4 and {m for _, m in policy.calls} == {256}  # 2 rollouts x 2 turns, our max_tokens
    for r in group:
        assert r.error_class is None, r.error_message
        assert r.reward == 1.0 and r.num_turns == 2 and r.task_id == task_ids[1] and not r.truncated
        (sample,) = r.samples  # the second turn's prompt extends the first turn's ids exactly: one branch
        text = renderer.decode(sample.prompt_ids + sample.completion_ids)
        assert "<tool_call>" in text and "<tool_response>" in text and text.endswith("<|im_end|>")
        sampled = [t for t, m in zip(sample.completion_ids, sample.completion_mask, strict=True) if m]
        assert sum(sample.completion_mask) == len(sampled) > 0 and sample.completion_mask[-2:] != [False] * 2
        assert r.policy_version >= 4  # the oldest version that sampled a turn of this rollout
    (err,) = failing
    assert err.error_class == "ProviderError" and not err.samples, (err.error_class, err.error_message)


def test_the_rollout_token_budget_clips_turns_and_ends_the_episode(model_dir, vf_envs_on_path):
    """``max_total_tokens`` bounds prompt + completion of every sampled turn, as in the chat loop (and so the
    trainer's rows): a turn is clipped to what is left of the budget and, when nothing is left, not sampled at all;
    the rollout is truncated with reason ``max_total_tokens``. The budget is set from the first turn's measured
    prompt length (the tool schemas make it several hundred tokens)."""
    from toolkit.models.renderer import HermesRenderer

    renderer = HermesRenderer(model_dir)

    async def go():
        rt = runtime(env_cfg(), model_dir)
        try:
            await rt.start()
            free = ToolPolicy(renderer)
            (whole,) = await rt.run_group(1, 1, client=free, sampling=SamplingParams(max_tokens=256))
            first_prompt = free.prompt_lens[0]
            rt.limits.max_total_tokens = first_prompt + 10  # the tool call (tens of tokens) no longer fits
            clipped_policy = ToolPolicy(renderer)
            (clipped,) = await rt.run_group(1, 1, client=clipped_policy, sampling=SamplingParams(max_tokens=256))
            rt.limits.max_total_tokens = first_prompt - 1  # not even the prompt fits
            none_policy = ToolPolicy(renderer)
            (empty,) = await rt.run_group(1, 1, client=none_policy, sampling=SamplingParams(max_tokens=256))
            return whole, first_prompt, clipped, clipped_policy, empty, none_policy
        finally:
            await rt.aclose()

    whole, first_prompt, clipped, clipped_policy, empty, none_policy = asyncio.run(go())
    assert whole.error_class is None and not whole.truncated and whole.num_turns == 2
    assert clipped.error_class is None and clipped.truncated and clipped.truncation_reason == "max_total_tokens"
    assert clipped_policy.calls[0][1] == 10 and clipped.reward == 0.0
    for sample in clipped.samples:
        assert len(sample.prompt_ids) + len(sample.completion_ids) <= first_prompt + 10
    assert empty.error_class is None and empty.truncated and empty.truncation_reason == "max_total_tokens"
    assert none_policy.calls == [] and not any(m for s in empty.samples for m in s.completion_mask)


def test_a_rollout_timeout_ends_the_episode_in_the_worker(model_dir, vf_envs_on_path):
    """The rollout times out while the model never answers: the rollout is a HarnessError, and the worker (still
    alive and serving) ends that episode too, its harness program and tool server included, instead of leaving
    them running with nobody waiting."""
    from toolkit.procutil import descendants

    class HangingPolicy:
        """Never answers. Until its first call it reports the time as an inference outage (``outage_seconds``, which
        the rollout timeout does not count), so the timeout runs from the model call on: starting the tool server
        and harness program on a loaded machine cannot use it up before the episode reaches the model."""

        def __init__(self) -> None:
            self.asked = asyncio.Event()
            self.t0, self.first_call = time.monotonic(), None

        def outage_seconds(self) -> float:
            return (self.first_call or time.monotonic()) - self.t0

        async def generate(self, prompt_ids, sampling, *, session_id):
            self.first_call = self.first_call or time.monotonic()
            self.asked.set()
            await asyncio.Event().wait()

    async def go():
        cfg = env_cfg()
        cfg.timeout.rollout = 20
        rt = runtime(cfg, model_dir)
        try:
            await rt.start()
            (worker,) = rt.workers
            policy = HangingPolicy()
            group = asyncio.create_task(rt.run_group(0, 1, client=policy, sampling=SamplingParams(max_tokens=16)))
            await asyncio.wait_for(policy.asked.wait(), 120)
            # The worker's fork server (toolkit.envs.forkserver) serves every episode of the worker and stays;
            # the episode's own processes (its program, forked by that server, and the tool server) must go.
            during = {p for p in descendants(worker.proc.pid) if not _is_fork_server(p)}
            (r,) = await group
            left = set(descendants(worker.proc.pid)) & during
            for _ in range(100):  # the cancel reaches the worker and verifiers tears the episode down
                if not left:
                    break
                await asyncio.sleep(0.2)
                left = set(descendants(worker.proc.pid)) & during
            health = await worker.conn.call("health", 10)
            return r, during, left, health
        finally:
            await rt.aclose()

    r, during, left, health = asyncio.run(go())
    assert r.error_class == "HarnessError" and "timed out" in r.error_message, r.error_message
    assert len(during) >= 2 and left == set(), (during, left)
    assert health["episodes"] == 0  # the worker lives on for the next episodes


def test_stopping_the_runtime_mid_episode_leaves_no_harness_program_or_tool_server(model_dir, vf_envs_on_path):
    """The orchestrator stops its workers (SIGTERM) while an episode waits for the model: the worker stops
    verifiers' servers and ends every process its episodes started (the harness program, the task's tool server),
    which run in sessions of their own and would otherwise outlive it."""
    from toolkit.procutil import descendants, pid_alive

    class HangingPolicy:
        def __init__(self) -> None:
            self.asked = asyncio.Event()

        async def generate(self, prompt_ids, sampling, *, session_id):
            self.asked.set()
            await asyncio.Event().wait()  # the engine never answers

    async def go():
        rt = runtime(env_cfg(), model_dir)
        await rt.start()
        policy = HangingPolicy()
        group = asyncio.create_task(rt.run_group(0, 1, client=policy, sampling=SamplingParams(max_tokens=16)))
        await asyncio.wait_for(policy.asked.wait(), 120)
        (worker,) = rt.workers
        below = descendants(worker.proc.pid)
        cmdlines = []
        for pid in below:
            with contextlib.suppress(OSError):
                cmdlines.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
        group.cancel()
        await asyncio.gather(group, return_exceptions=True)
        await rt.aclose()
        return worker.proc.pid, below, cmdlines

    worker_pid, below, cmdlines = asyncio.run(go())
    # While the episode waited, the harness program and the tool server were running below the worker.
    assert any("codebook_lookup" in c for c in cmdlines) and len(below) >= 2, cmdlines
    assert not pid_alive(worker_pid) and [p for p in below if pid_alive(p)] == []


def test_an_env_that_runs_two_attempts_gives_a_rollout_per_trainable_trace(model_dir, vf_envs_on_path):
    """best-of-two (tests/fixtures/vf_envs) exports its own Env, which runs the solver twice per episode and records
    the better reward on both traces: a group of 2 episodes gives 4 rollouts, each with its own sample, reward and
    verifiers' metric."""
    from toolkit.models.renderer import HermesRenderer

    renderer = HermesRenderer(model_dir)

    class Yes:
        calls = 0

        async def generate(self, prompt_ids, sampling, *, session_id):
            Yes.calls += 1
            ids = renderer.encode("yes") + [renderer.stop_token_ids[0]]
            return Generation(ids, [-0.5] * len(ids), "stop", policy_version=2)

    async def go():
        rt = runtime(env_cfg(taskset_id="best-of-two"), model_dir)
        try:
            await rt.start()
            assert rt.mode == "trace"
            return await rt.run_group(0, 2, client=Yes(), sampling=SamplingParams(max_tokens=8))
        finally:
            await rt.aclose()

    group = asyncio.run(go())
    assert Yes.calls == 4 and len(group) == 4, [(r.error_class, r.error_message) for r in group]
    for r in group:
        assert r.error_class is None and r.reward == 1.0 and r.metrics["best_of_two"] == 1.0, r
        assert r.seat == "solver"  # the env's seat: the buffer's per-seat baseline groups by it
        (sample,) = r.samples
        assert renderer.decode(sample.completion_ids) == "yes<|im_end|>" and r.policy_version == 2


def _is_fork_server(pid: int) -> bool:
    """Whether ``pid`` is an env worker's harness-program fork server (its command line names the module)."""
    try:
        return b"toolkit.envs.forkserver" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
