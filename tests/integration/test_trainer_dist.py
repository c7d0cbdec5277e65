"""2-rank CPU (gloo, FSDP2) trainer vs 1 rank: same gradient; full 2-rank trainer run with DCP checkpoint + resume.

This file is also the torchrun worker: ``torchrun --nproc-per-node 2 test_trainer_dist.py grads OUT MODEL``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]


def _batch():
    from toolkit.batches import samples_to_batch
    from toolkit.orchestrator.types import TrainingSample

    rng = np.random.default_rng(3)
    samples, adv = [], []
    for _ in range(11):  # odd count and mixed lengths: uneven rows per rank, padding micro-batches
        p, c = int(rng.integers(2, 10)), int(rng.integers(2, 30))
        mask = (rng.random(c) > 0.1).tolist()
        samples.append(TrainingSample(rng.integers(4, 100, p).tolist(), rng.integers(4, 100, c).tolist(), mask,
                                      np.where(mask, -rng.random(c) * 5, 0.0).tolist()))
        adv.append(float(rng.normal()))
    return samples_to_batch(1, samples, adv, policy_versions=[0] * 11, envs=["e"] * 11)


def _grads(model_dir: str, rank: int, world: int):
    import torch

    from toolkit.trainer import dist as tdist
    from toolkit.trainer.loss import IPOLoss
    from toolkit.trainer.model import load_policy
    from toolkit.trainer.packing import plan_micro_batches
    from toolkit.trainer.step import DistInfo, train_step

    info = DistInfo(rank=rank, world_size=world)
    model = tdist.shard_model(load_policy(model_dir), info)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    b = _batch()
    mbs = plan_micro_batches(b, seq_len=48, micro_batch_size=2, rank=rank, world_size=world)
    m = train_step(model, opt, None, mbs, loss_cfg=IPOLoss(), max_norm=0.0, num_samples=b.num_samples, info=info,
                   apply_update=False)
    grads = {}
    for name, p in model.named_parameters():
        g = p.grad
        grads[name] = (g.full_tensor() if hasattr(g, "full_tensor") else g).detach().clone()
    return m, grads


def _worker(argv):
    import torch

    from toolkit.trainer import dist as tdist

    mode, out = argv[0], Path(argv[1])
    info, _ = tdist.init_distributed()
    if mode == "grads":
        m, grads = _grads(argv[2], info.rank, info.world_size)
        if info.rank == 0:
            torch.save({"metrics": m, "grads": grads}, out)
    tdist.shutdown(info)


def _torchrun(args, timeout=300):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *args]
    r = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    return r


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from toolkit.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.mark.slow
def test_two_rank_gradient_equals_one_rank(tiny_dir, tmp_path):
    import torch

    out = tmp_path / "grads.pt"
    _torchrun([__file__, "grads", str(out), str(tiny_dir)])
    two = torch.load(out)
    m1, g1 = _grads(str(tiny_dir), 0, 1)
    assert two["metrics"]["loss/mean"] == pytest.approx(m1["loss/mean"], abs=1e-6)
    assert two["metrics"]["optim/grad_norm"] == pytest.approx(m1["optim/grad_norm"], rel=1e-5)
    assert set(two["grads"]) == set(g1)
    worst = max(float((two["grads"][k] - g1[k]).abs().max()) for k in g1)
    assert worst < 1e-5, worst


@pytest.mark.slow
def test_two_rank_trainer_run_broadcasts_checkpoints_and_resumes(tiny_dir, tmp_path):
    from toolkit.batches import write_batch
    from toolkit.checkpoints import mark_complete_if_ready, part_dir
    from toolkit.config.model import RLConfig
    from toolkit.orchestrator.types import TrainingSample
    from toolkit.rundir import RunDir
    from toolkit.trainer.broadcast import is_stable

    run = RunDir(tmp_path / "run")
    cfg = RLConfig.model_validate({
        "max_steps": 3, "model": {"name": str(tiny_dir)},
        "trainer": {"seq_len": 64, "micro_batch_size": 1, "optim": {"lr": 1e-3}, "batch_timeout_s": 60},
        "ckpt": {"interval": 2},
    })
    run.resolved("rl").parent.mkdir(parents=True)
    run.resolved("rl").write_text(cfg.model_dump_json())
    rng = np.random.default_rng(0)
    for step in (1, 2, 3):
        samples = [TrainingSample(rng.integers(4, 100, 6).tolist(), rng.integers(4, 100, 20).tolist(), [True] * 20,
                                  (-rng.random(20) * 3).tolist()) for _ in range(6)]
        write_batch(run, step, samples, rng.normal(size=6).tolist(), policy_versions=[0] * 6, envs=["e"] * 6, meta={})
    _torchrun(["-m", "toolkit.trainer.main", "--run-dir", str(run.root)])
    assert all(is_stable(run.broadcast_step(s)) for s in (2, 3))
    assert not (run.checkpoint_step(2) / "COMPLETE").exists()  # trainer part only so far
    # The orchestrator writes its part of step 2 second, and so marks the step COMPLETE.
    part_dir(run, 2, "orchestrator").mkdir(parents=True)
    assert mark_complete_if_ready(run, 2)
    assert (run.checkpoint_step(3) / "trainer" / "dcp").is_dir()
    lines = [json.loads(x) for x in run.metrics.read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2, 3] and all(x["role"] == "trainer" for x in lines)
    # Resume from the COMPLETE step 2 (step 3 lacks the orchestrator part): step 3 again, same result.
    first_step3 = lines[2]["loss/mean"]
    run.metrics.unlink()
    _torchrun(["-m", "toolkit.trainer.main", "--run-dir", str(run.root)])
    again = [json.loads(x) for x in run.metrics.read_text().splitlines()]
    assert [x["step"] for x in again] == [3]
    assert again[0]["loss/mean"] == pytest.approx(first_step3, abs=1e-6)


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    _worker(sys.argv[1:])
