"""``srl export`` of a multi-rank checkpoint (the ``dcp/`` shards of a 2-rank FSDP2 trainer on CPU): the exported
weights equal the policy the trainer broadcast at that step, tensor for tensor.

A run directory with a resolved config and three batches is trained by ``torchrun --nproc-per-node 2`` (gloo), with
checkpoints at steps 2 and 3; step 2 is made complete the way the orchestrator does (its part, then the marker).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from prereqs import need_module

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow]


def _run_dir(root: Path, model_dir: Path):
    from toolkit.batches import write_batch
    from toolkit.config.model import RLConfig
    from toolkit.run.layout import RunDir
    from toolkit.run.types import TrainingSample

    run = RunDir(root)
    cfg = RLConfig.model_validate(
        {
            "max_steps": 3,
            "model": {"name": str(model_dir)},
            "ckpt": {"interval": 2},
            "trainer": {"seq_len": 64, "micro_batch_size": 1, "optim": {"lr": 1e-2}, "batch_timeout_s": 60},
        }
    )
    run.resolved("rl").parent.mkdir(parents=True)
    run.resolved("rl").write_text(cfg.model_dump_json())
    rng = np.random.default_rng(0)
    for step in (1, 2, 3):
        samples = [
            TrainingSample(
                rng.integers(4, 100, 6).tolist(),
                rng.integers(4, 100, 20).tolist(),
                [True] * 20,
                (-rng.random(20) * 3).tolist(),
            )
            for _ in range(6)
        ]
        write_batch(run, step, samples, rng.normal(size=6).tolist(), policy_versions=[0] * 6, envs=["e"] * 6, meta={})
    return run


def test_export_of_a_two_rank_dcp_checkpoint_equals_the_trainers_broadcast(tmp_path):
    torch = need_module("torch")
    from safetensors.torch import load_file

    from toolkit.checkpoints import mark_complete_if_ready, part_dir
    from toolkit.models.tiny import build_tiny_model

    run = _run_dir(tmp_path / "run", build_tiny_model(tmp_path / "tiny", seed=0))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "toolkit.trainer.main",
            "--run-dir",
            str(run.root),
        ],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    assert (run.checkpoint_step(2) / "trainer" / "dcp").is_dir()
    part_dir(run, 2, "orchestrator").mkdir(parents=True)
    assert mark_complete_if_ready(run, 2)

    out = tmp_path / "export"
    r = subprocess.run(
        [sys.executable, "-m", "toolkit.cli", "export", str(run.root), str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "exported checkpoint step 2" in r.stdout  # the newest complete one (step 3 lacks the orchestrator part)
    got = load_file(str(out / "model.safetensors"))
    want = load_file(str(run.broadcast_step(2) / "model.safetensors"))
    assert set(got) == set(want)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=0, msg=k)
    step3 = load_file(str(run.broadcast_step(3) / "model.safetensors"))
    assert any(not torch.equal(step3[k], want[k]) for k in want)  # steps differ: the check can tell them apart
