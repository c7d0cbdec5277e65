"""The orchestrator on real env workers against the loopback inference server (no vLLM): env worker crashes and
the zero-signal guard (issue 9 items 2 and 8).

The loopback server answers every request with the same tokens, so every rollout of a group gets the same reward
from the real reverse-text scorer: each group has zero learning signal. That is the zero-signal case itself, and
for the worker-crash test the guard is switched off (``max_empty_steps = None``).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import pytest
from prereqs import need_module

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
need_module("verifiers.v1")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from loopback_server import LoopbackServer

from toolkit import batches
from toolkit.config.model import RLConfig
from toolkit.engines.health import write_ready
from toolkit.fsutil import write_marker
from toolkit.orchestrator.main import Orchestrator
from toolkit.run import ending
from toolkit.run.layout import STABLE_MARKER, RunDir
from toolkit.run.metrics import ORCHESTRATOR, recorded_steps


def _cfg(max_steps: int, max_empty_steps: int | None, max_async_level: int | None = None) -> RLConfig:
    """The loopback run's config; ``max_async_level`` None: ``max_steps`` (no step ever waits for a policy)."""
    async_level = max_steps if max_async_level is None else max_async_level
    return RLConfig.model_validate(
        {
            "max_steps": max_steps,
            "seed": 5,
            "ckpt": {"interval": 2},
            "orchestrator": {
                "batch_size": 4,
                "group_size": 2,
                "max_async_level": async_level,
                "max_concurrent": 4,
                # The loopback server cannot load weights: steps wait for the trainer's published version only.
                "update_weights": max_async_level is None,
                "train": {
                    "sampling": {"max_completion_tokens": 8},
                    "env": [{"name": "rev", "taskset": {"id": "srl-reverse-text"}, "retries": 3}],
                },
            },
            "monitors": {"stop": {"max_empty_steps": max_empty_steps}},
        }
    )


def _orch_steps(run: RunDir) -> list[int]:
    return [x["step"] for x in map(json.loads, run.metrics.read_text().splitlines()) if x.get("role") == "orchestrator"]


def _ready(run: RunDir, url: str) -> None:
    write_ready(run, {"base_url": url, "router_url": None, "engine_urls": [url], "model": "tiny", "policy_version": 0})


def test_killed_env_worker_is_replaced_and_the_run_completes(tmp_path):
    run = RunDir(tmp_path / "run")
    # max_async_level 1: step n needs policy version n - 2, so the orchestrator writes steps 1 and 2 and then waits
    # at step 3 for version 1, which only this test publishes (it plays the trainer).
    cfg = _cfg(max_steps=6, max_empty_steps=None, max_async_level=1)
    killed = []
    with LoopbackServer([73, 72, 71, 2]) as srv:
        _ready(run, srv.url)

        async def go():
            orch = Orchestrator(cfg, run)
            task = asyncio.create_task(orch.run_until_done())
            while 2 not in recorded_steps(run.metrics, ORCHESTRATOR) and not task.done():
                await asyncio.sleep(0.05)
            assert not task.done(), task.result()  # held at step 3 until version 1 is published
            worker = orch.train_envs["rev"].runtime.workers[0]
            killed.append(worker.proc.pid)
            # Stopped, the worker takes step 3's requests and answers none: they stay in flight until the kill.
            os.kill(worker.proc.pid, signal.SIGSTOP)
            for version in range(1, 5):  # every version steps 3..6 need (up to 6 - 2 = 4)
                run.broadcast_step(version).mkdir(parents=True)
                write_marker(run.broadcast_step(version) / STABLE_MARKER)
            while worker.conn.inflight == 0 and not task.done():
                await asyncio.sleep(0.05)
            assert not task.done(), task.result()
            os.kill(worker.proc.pid, signal.SIGKILL)  # mid-run, rollouts in flight
            replaced = None
            # The runtime restarts the dead worker in the background, into the same worker slot.
            while replaced is None and not task.done():
                proc = worker.proc
                if proc is not None and proc.pid != killed[0] and proc.returncode is None:
                    replaced = proc.pid
                await asyncio.sleep(0.05)
            rc = await asyncio.wait_for(task, 600)
            if replaced is None and worker.proc is not None and worker.proc.pid != killed[0]:
                # On a loaded machine the rest of the run can finish between two polls: the worker slot (closed
                # with the runtime by now, which drops its list) still holds the replacement's process.
                replaced = worker.proc.pid
            return rc, replaced

        rc, new_pid = asyncio.run(go())
    assert rc == 0
    assert new_pid is not None and new_pid != killed[0]  # a replacement worker served the rest of the run
    assert sorted(_orch_steps(run)) == [1, 2, 3, 4, 5, 6]
    assert all(batches.is_ready(run.rollout_step(s)) for s in range(1, 7))
    print(
        f"\n[figure] env worker {killed[0]} killed with step 3's requests in flight; replaced by {new_pid}; 6/6 "
        "steps written"
    )


def test_zero_signal_guard_warns_with_counts_and_stops(tmp_path, caplog):
    run = RunDir(tmp_path / "run")
    cfg = _cfg(max_steps=8, max_empty_steps=2)
    with LoopbackServer([73, 72, 71, 2]) as srv:
        _ready(run, srv.url)
        with caplog.at_level("WARNING"):
            rc = asyncio.run(asyncio.wait_for(Orchestrator(cfg, run).run_until_done(), 600))
    assert rc == 0  # a stop is a clean, resumable end
    steps = _orch_steps(run)
    assert steps == [1, 2], steps  # stopped after max_empty_steps empty steps, not at max_steps
    warnings = [r.getMessage() for r in caplog.records if "no learning signal" in r.getMessage()]
    assert len(warnings) == 2 and "2 groups offered" in warnings[0] and "0 with differing rewards" in warnings[0]
    reason = run.stop_request.read_text()
    assert "zero-signal guard" in reason and "2 consecutive steps" in reason
    # The orchestrator recorded why the run ends; the supervisor's settle keeps it and exits with status 4.
    recorded = ending.read(run)
    assert recorded is not None and (recorded.cause, recorded.criterion, recorded.role) == (
        "no-signal",
        "zero-signal guard",
        "orchestrator",
    )
    assert ending.settle(run).exit_status == 4
    print(f"\n[figure] zero-signal: stopped after steps {steps}; stop request: {reason.strip()}")
