"""EnvRuntime with real env worker processes: external taskset by id, TaskError boundary, a crashed and a hung
worker, stage timeouts, retries, and no orphan processes after aclose.

The policy is a scripted stand-in (see tests/unit/test_rollout_prefix.py); the vLLM path is
tests/integration/test_envs_vllm.py.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest
from prereqs import need_module

need_module("verifiers.v1")
need_module("transformers")

from toolkit.envs.runtime import EnvRuntime
from toolkit.errors import ProviderError
from toolkit.run.types import Generation, SamplingParams

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "external_taskset"

# Each env worker process imports verifiers (5-10 s of CPU): slow by the project rule.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from toolkit.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture
def external_on_path(monkeypatch):
    # Workers are child processes: they find the external module through PYTHONPATH.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(FIXTURES), os.environ.get("PYTHONPATH")])))


def env_cfg(taskset_id: str, *, workers: int = 2, retries: int = 0, timeout=None, **extra):
    return SimpleNamespace(
        name=taskset_id,
        env_name=taskset_id,
        taskset=SimpleNamespace(id=taskset_id, split="train", seed=0, select={"limit": 4}, model_extra=extra),
        harness=SimpleNamespace(id="default", runtime=SimpleNamespace(type="subprocess")),
        timeout=SimpleNamespace(**({"setup": 10, "rollout": 30, "finalize": 10, "scoring": 10} | (timeout or {}))),
        max_turns=4,
        max_total_tokens=None,
        retries=retries,
        pool=SimpleNamespace(type="static", max_workers=workers, multiplex=1),
        address=None,
    )


class AnswerPolicy:
    """Scripted policy: answers ``text`` (encoded with the model's tokenizer) + eos; can fail its first calls."""

    def __init__(self, model_dir, text: str, fail_first: int = 0) -> None:
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(str(model_dir))
        self.text, self.fail_first, self.calls = text, fail_first, 0

    async def generate(self, prompt_ids, sampling, *, session_id):
        self.calls += 1
        if self.calls <= self.fail_first:
            raise ProviderError("engine restarting (injected)")
        ids = self.tok.encode(self.text, add_special_tokens=False) + [self.tok.eos_token_id]
        return Generation(token_ids=ids, logprobs=[-1.0] * len(ids), finish_reason="stop", policy_version=0)


def child_pids(runtime: EnvRuntime) -> list[int]:
    return [w.proc.pid for w in runtime.workers if w.proc is not None]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_external_taskset_runs_through_workers(model_dir, external_on_path):
    async def go():
        rt = EnvRuntime(
            env_cfg("count-letters", letter="a", num_examples=6), model_path=model_dir, renderer_cfg=None, seed=0
        )
        await rt.start()
        try:
            assert rt.example_ids() == [0, 1, 2, 3] and rt.example_ids(2) == [0, 1]
            pids = child_pids(rt)
            assert len(pids) == 2
            # Find the example whose answer is "3" by scoring a fixed reply on each: rewards are 0/1.
            policy = AnswerPolicy(model_dir, "3")
            groups = [
                await rt.run_group(i, 3, client=policy, sampling=SamplingParams(max_tokens=8)) for i in rt.example_ids()
            ]
        finally:
            await rt.aclose()
        return pids, groups

    pids, groups = asyncio.run(go())
    assert not any(alive(p) for p in pids)
    rewards = [[r.reward for r in g] for g in groups]
    assert all(len(set(g)) == 1 for g in rewards)  # same reply, same reward within a group
    assert {g[0] for g in rewards} <= {0.0, 1.0}
    for g in groups:
        for r in g:
            assert r.error_class is None and r.num_turns == 1 and len(r.samples) == 1
            assert r.task_id.startswith("count-") and r.reward_components.keys() == {"correct"}


def test_env_requests_per_rollout(model_dir):
    """Round trips to the worker: a single-turn group is one start_group plus one step per rollout (the score comes
    with the step); a multi-turn rollout adds its further steps and one finish, and no close after a finish."""

    def recorded(rt):
        calls = []
        for w in rt.workers:
            orig = w.conn.call

            async def call(op, *args, _orig=orig, **kwargs):
                calls.append(op)
                return await _orig(op, *args, **kwargs)

            w.conn.call = call
        return calls

    async def go(taskset_id, group_size):
        rt = EnvRuntime(env_cfg(taskset_id, workers=1), model_path=model_dir, renderer_cfg=None, seed=0)
        await rt.start()
        try:
            calls = recorded(rt)
            group = await rt.run_group(
                0, group_size, client=AnswerPolicy(model_dir, "b\na"), sampling=SamplingParams(max_tokens=8)
            )
        finally:
            await rt.aclose()
        return calls, group

    calls, group = asyncio.run(go("srl-reverse-text", 4))
    assert all(r.error_class is None and r.num_turns == 1 for r in group)
    assert sorted(calls) == ["start_group"] + ["step"] * 4
    calls, group = asyncio.run(go("srl-alphabet-sort", 2))
    assert all(r.error_class is None and r.num_turns == 2 for r in group), [r.error_message for r in group]
    assert sorted(calls) == ["finish"] * 2 + ["start_group"] + ["step"] * 4


def test_raising_scorer_gives_task_error_without_retry(model_dir, external_on_path):
    async def go():
        rt = EnvRuntime(env_cfg("raising-scorer", retries=3), model_path=model_dir, renderer_cfg=None, seed=0)
        await rt.start()
        try:
            policy = AnswerPolicy(model_dir, "0")
            return await rt.run_group(0, 2, client=policy, sampling=SamplingParams(max_tokens=8)), policy.calls
        finally:
            await rt.aclose()

    group, calls = asyncio.run(go())
    assert [r.error_class for r in group] == ["TaskError", "TaskError"]
    assert all(r.samples == [] for r in group) and "scorer bug on purpose" in group[0].error_message
    assert calls == 2  # deterministic class: not retried


def test_provider_errors_are_retried(model_dir):
    async def go():
        rt = EnvRuntime(
            env_cfg("srl-reverse-text", workers=1, retries=2), model_path=model_dir, renderer_cfg=None, seed=0
        )
        await rt.start()
        try:
            ok = await rt.run_group(
                0, 1, client=AnswerPolicy(model_dir, "abc", fail_first=2), sampling=SamplingParams(max_tokens=16)
            )
            bad = await rt.run_group(
                0, 1, client=AnswerPolicy(model_dir, "abc", fail_first=5), sampling=SamplingParams(max_tokens=16)
            )
        finally:
            await rt.aclose()
        return ok[0], bad[0]

    ok, bad = asyncio.run(go())
    assert ok.error_class is None and ok.metrics["retries"] == 2.0 and ok.samples
    assert bad.error_class == "ProviderError" and bad.samples == [] and bad.metrics["retries"] == 2.0


def test_crashed_worker_is_replaced_and_rollout_retried(model_dir):
    async def go():
        rt = EnvRuntime(
            env_cfg("srl-reverse-text", workers=1, retries=1), model_path=model_dir, renderer_cfg=None, seed=0
        )
        await rt.start()
        try:
            first = child_pids(rt)[0]
            os.kill(first, signal.SIGKILL)
            await asyncio.sleep(0.3)
            group = await rt.run_group(
                1, 2, client=AnswerPolicy(model_dir, "xyz"), sampling=SamplingParams(max_tokens=16)
            )
            second = child_pids(rt)[0]
        finally:
            await rt.aclose()
        return first, second, group

    first, second, group = asyncio.run(go())
    assert first != second and not alive(second)
    assert all(r.error_class is None for r in group)


def test_hung_scorer_worker_is_killed_and_replaced(model_dir, external_on_path, monkeypatch):
    import toolkit.envs.runtime as runtime_mod

    monkeypatch.setattr(runtime_mod, "GRACE_S", 0.5)
    # The limits also bound the healthy episode on the replacement worker (its first scoring in a fresh process):
    # 10 s leaves room for a loaded machine and still ends the hung scorer long before its hour.
    cfg = env_cfg("hanging-scorer", workers=1, timeout={"finalize": 10, "scoring": 10})

    async def go():
        rt = EnvRuntime(cfg, model_path=model_dir, renderer_cfg=None, seed=0)
        await rt.start()
        try:
            first = child_pids(rt)[0]
            t0 = asyncio.get_running_loop().time()
            hung = await rt.run_group(0, 1, client=AnswerPolicy(model_dir, "hi"), sampling=SamplingParams(max_tokens=8))
            waited = asyncio.get_running_loop().time() - t0
            fine = await rt.run_group(1, 1, client=AnswerPolicy(model_dir, "hi"), sampling=SamplingParams(max_tokens=8))
            second = child_pids(rt)[0]
        finally:
            await rt.aclose()
        return first, second, hung[0], fine[0], waited

    first, second, hung, fine, waited = asyncio.run(go())
    assert hung.error_class == "TaskError" and "scoring" in hung.error_message and hung.samples == []
    assert waited < 300  # stage timeouts + a worker restart, not the scorer's hour
    assert first != second and not alive(first)
    assert fine.error_class is None and fine.reward == 1.0


def test_hung_user_turn_times_out_rollout_and_replaces_worker(model_dir, external_on_path, monkeypatch):
    import toolkit.envs.runtime as runtime_mod

    monkeypatch.setattr(runtime_mod, "GRACE_S", 0.5)
    # The rollout limit also bounds the healthy episode on the replacement worker: 10 s, room for a loaded machine.
    cfg = env_cfg("hanging-scorer", workers=1, timeout={"rollout": 10}, hang_in="user_turn")

    async def go():
        rt = EnvRuntime(cfg, model_path=model_dir, renderer_cfg=None, seed=0)
        await rt.start()
        try:
            first = child_pids(rt)[0]
            policy = AnswerPolicy(model_dir, "hi")
            hung = await rt.run_group(0, 1, client=policy, sampling=SamplingParams(max_tokens=8))
            fine = await rt.run_group(1, 1, client=policy, sampling=SamplingParams(max_tokens=8))
            second = child_pids(rt)[0]
        finally:
            await rt.aclose()
        return first, second, hung[0], fine[0]

    first, second, hung, fine = asyncio.run(go())
    assert hung.error_class == "HarnessError" and "timed out" in hung.error_message
    assert first != second and not alive(first)
    assert fine.error_class is None and fine.reward == 1.0


def test_external_address_server(model_dir):
    """An env server started outside the runtime (``address``): used, never stopped by ``aclose``."""
    import json
    import subprocess
    import sys

    from toolkit.envs.runtime import env_spec

    cfg = env_cfg("srl-arith", workers=1)
    proc = subprocess.Popen(
        [sys.executable, "-m", "toolkit.envs.server", "--spec", "-", "--port", "0"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        proc.stdin.write(json.dumps(env_spec(cfg)))
        proc.stdin.close()
        ready = proc.stdout.readline().split()
        assert ready[0] == "SRL_ENV_WORKER_READY"
        cfg.address = ready[1]

        async def go():
            rt = EnvRuntime(cfg, model_path=model_dir, renderer_cfg=None, seed=0)
            await rt.start()
            try:
                assert child_pids(rt) == [] and rt.example_ids() == [0, 1, 2, 3]
                return await rt.run_group(0, 2, client=AnswerPolicy(model_dir, "0"), sampling=SamplingParams())
            finally:
                await rt.aclose()

        group = asyncio.run(go())
        assert all(r.error_class is None and r.task_id == "arith/train/0" for r in group)
        assert proc.poll() is None  # external: still running after aclose
    finally:
        proc.terminate()
        proc.wait(30)


def test_a_worker_that_prints_on_stdout_starts_and_is_never_blocked(model_dir, external_on_path, caplog):
    """A blank line and a banner on stdout before the announcement are logged, not taken for a failed start; 100 KB
    per scored rollout on stdout (a pipe holds 64 KB) is drained, so 8 groups of 4 finish without an error."""

    async def go():
        rt = EnvRuntime(env_cfg("chatty-stdout", workers=1), model_path=model_dir, renderer_cfg=None, seed=0)
        await rt.start()
        try:
            policy = AnswerPolicy(model_dir, "ok")
            return [
                await rt.run_group(i % 4, 4, client=policy, sampling=SamplingParams(max_tokens=8)) for i in range(8)
            ]
        finally:
            await rt.aclose()

    with caplog.at_level("INFO", logger="srl.orchestrator"):
        groups = asyncio.run(go())
    assert [r.error_class for g in groups for r in g] == [None] * 32
    assert {r.reward for g in groups for r in g} == {1.0}
    assert any("on stdout: chatty-stdout: loading" in m for m in caplog.messages)


def test_a_worker_killed_before_it_announced_itself_is_started_again_once(model_dir, external_on_path, tmp_path):
    """Killed by a signal while loading: started again (the second one serves); killed every time: the error names
    the signal. A worker that exits with a status (an import error, a refusal) is not started again."""

    async def go(**extra):
        rt = EnvRuntime(env_cfg("chatty-stdout", workers=1, **extra), model_path=model_dir, renderer_cfg=None, seed=0)
        try:
            await rt.start()
            return await rt.run_group(0, 2, client=AnswerPolicy(model_dir, "ok"), sampling=SamplingParams(max_tokens=8))
        finally:
            await rt.aclose()

    marker = tmp_path / "died"
    group = asyncio.run(go(die_once=str(marker)))
    assert marker.exists() and [r.reward for r in group] == [1.0, 1.0]
    with pytest.raises(RuntimeError, match=r"env worker for 'chatty-stdout' failed to start \(killed by SIGKILL\)"):
        asyncio.run(go(die_on_load=True))
    with pytest.raises(RuntimeError, match=r"failed to start \(exited with status 1\)[\s\S]*ModuleNotFoundError"):
        asyncio.run(_start_a_missing_taskset(model_dir))


async def _start_a_missing_taskset(model_dir):
    rt = EnvRuntime(env_cfg("no-such-taskset-module", workers=1), model_path=model_dir, renderer_cfg=None, seed=0)
    try:
        await rt.start()
    finally:
        await rt.aclose()


def test_a_worker_asked_for_its_stacks_writes_them_to_the_log_and_serves_on(model_dir, external_on_path, caplog):
    """The watchdog's stack request (the signal to each pid of the orchestrator's progress record, which lists the
    runtime's ``pids``) reaches a real worker: its Python stacks arrive in the orchestrator's log through the drained
    stderr, and the worker goes on serving."""
    from toolkit.launch.watchdog import request_stacks

    async def go():
        rt = EnvRuntime(env_cfg("chatty-stdout", workers=1), model_path=model_dir, renderer_cfg=None, seed=0)
        await rt.start()
        try:
            [pid] = rt.pids
            request_stacks([pid])
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 120.0
            while not any("most recent call first" in m for m in caplog.messages):
                assert loop.time() < deadline, "the worker's stacks never reached the log"
                await asyncio.sleep(0.1)
            group = await rt.run_group(
                0, 2, client=AnswerPolicy(model_dir, "ok"), sampling=SamplingParams(max_tokens=8)
            )
        finally:
            await rt.aclose()
        assert rt.pids == []
        return pid, group

    with caplog.at_level("INFO", logger="srl.orchestrator"):
        pid, group = asyncio.run(go())
    assert [r.reward for r in group] == [1.0, 1.0]
    stacks = [m for m in caplog.messages if f"(pid {pid})" in m]
    assert any("most recent call first" in m for m in stacks) and any("server.py" in m for m in stacks), stacks
