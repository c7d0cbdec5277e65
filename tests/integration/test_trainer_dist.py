"""2-rank CPU (gloo, FSDP2) trainer vs 1 rank: same gradient; full 2-rank trainer run with DCP checkpoint + resume.

This file is also the torchrun worker: ``torchrun --nproc-per-node 2 test_trainer_dist.py grads OUT MODEL``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]


def _batch():
    from toolkit.batches import samples_to_batch
    from toolkit.run.types import TrainingSample

    rng = np.random.default_rng(3)
    samples, adv = [], []
    for _ in range(11):  # odd count and mixed lengths: uneven rows per rank, padding micro-batches
        p, c = int(rng.integers(2, 10)), int(rng.integers(2, 30))
        mask = (rng.random(c) > 0.1).tolist()
        samples.append(
            TrainingSample(
                rng.integers(4, 100, p).tolist(),
                rng.integers(4, 100, c).tolist(),
                mask,
                np.where(mask, -rng.random(c) * 5, 0.0).tolist(),
            )
        )
        adv.append(float(rng.normal()))
    return samples_to_batch(1, samples, adv, policy_versions=[0] * 11, envs=["e"] * 11)


LORA = {"rank": 4, "alpha": 8.0, "dropout": 0.0, "target_modules": ["q_proj", "v_proj", "down_proj"]}


def _policy(model_dir: str, lora: bool):
    """The tiny policy, optionally with LoRA adapters whose B is not zero (a zero B gives A no gradient, and a
    comparison of A's gradients would pass trivially). Same seed on every rank: identical starting weights."""
    import torch

    from toolkit.trainer.model import load_policy

    model = load_policy(model_dir)
    if lora:
        from toolkit.trainer.lora import apply_lora

        torch.manual_seed(7)
        model = apply_lora(model, LORA)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0.0, 0.05)
    return model


def _grads(model_dir: str, rank: int, world: int, lora: bool = False):
    import torch

    from toolkit.trainer import dist as tdist
    from toolkit.trainer.loss import IPOLoss
    from toolkit.trainer.packing import plan_micro_batches
    from toolkit.trainer.step import DistInfo, train_step

    info = DistInfo(rank=rank, world_size=world)
    model = tdist.shard_model(_policy(model_dir, lora), info)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    b = _batch()
    mbs = plan_micro_batches(b, seq_len=48, micro_batch_size=2, rank=rank, world_size=world)
    m = train_step(
        model,
        opt,
        None,
        mbs,
        loss_cfg=IPOLoss(),
        max_norm=0.0,
        num_samples=b.num_samples,
        info=info,
        apply_update=False,
    )
    grads = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            assert p.grad is None, name  # frozen base weights under LoRA: no gradient
            continue
        g = p.grad
        grads[name] = (g.full_tensor() if hasattr(g, "full_tensor") else g).detach().clone()
    return m, grads


def _worker(argv):
    import torch

    from toolkit.trainer import dist as tdist

    mode, out = argv[0], Path(argv[1])
    info, _ = tdist.init_distributed()
    if mode in ("grads", "lora-grads"):
        m, grads = _grads(argv[2], info.rank, info.world_size, lora=mode == "lora-grads")
        if info.rank == 0:
            torch.save({"metrics": m, "grads": grads}, out)
    if mode == "lora-merged":
        from toolkit.trainer.model import full_state_dict

        model = tdist.shard_model(_policy(argv[2], lora=True), info)
        merged = full_state_dict(model, info=info)
        assert (merged is None) == (info.rank != 0)
        if info.rank == 0:
            torch.save(merged, out)
    tdist.shutdown(info)


def _torchrun(args, timeout=300):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *args]
    r = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    return r


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from toolkit.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["grads", "lora-grads"])
def test_two_rank_gradient_equals_one_rank(tiny_dir, tmp_path, mode):
    import torch

    out = tmp_path / "grads.pt"
    _torchrun([__file__, mode, str(out), str(tiny_dir)])
    two = torch.load(out)
    m1, g1 = _grads(str(tiny_dir), 0, 1, lora=mode == "lora-grads")
    if mode == "lora-grads":  # only the adapters train, and every adapter matrix has a gradient
        assert g1 and all("lora_" in k for k in g1)
        assert all(float(g.abs().max()) > 0 for g in g1.values())
    assert two["metrics"]["loss/mean"] == pytest.approx(m1["loss/mean"], abs=1e-6)
    assert two["metrics"]["optim/grad_norm"] == pytest.approx(m1["optim/grad_norm"], rel=1e-5)
    assert set(two["grads"]) == set(g1)
    worst = max(float((two["grads"][k] - g1[k]).abs().max()) for k in g1)
    assert worst < 1e-5, worst


@pytest.mark.slow
def test_two_rank_lora_model_exports_the_whole_merged_model(tiny_dir, tmp_path):
    """An SFT run with LoRA on 2 ranks ends with a full model: the adapters gathered from their shards and folded
    into the gathered base weights give the 1-rank merge, and a forward of that merge equals the adapted model's."""
    import torch
    from transformers import AutoModelForCausalLM

    from toolkit.trainer.lora import merged_state_dict

    out = tmp_path / "merged.pt"
    _torchrun([__file__, "lora-merged", str(out), str(tiny_dir)])
    two = torch.load(out)
    adapted = _policy(str(tiny_dir), lora=True)
    one = merged_state_dict(adapted)
    assert set(two) == set(one) and not any("lora_" in k or "base_layer" in k for k in one)
    assert max(float((two[k] - one[k]).abs().max()) for k in one) < 1e-6
    plain = AutoModelForCausalLM.from_pretrained(tiny_dir)
    changed = [k for k in one if not torch.equal(one[k], plain.state_dict()[k])]
    assert changed and all(k.endswith(("q_proj.weight", "v_proj.weight", "down_proj.weight")) for k in changed)
    plain.load_state_dict(two)
    ids = torch.tensor([[5, 17, 42, 9, 3, 77]])
    with torch.no_grad():
        want, got = adapted(input_ids=ids).logits, plain(input_ids=ids).logits
    assert float((want - got).abs().max()) < 1e-4


def _trainer_run(root: Path, tiny_dir: Path, *, lora: dict | None = None):
    """A run directory with a resolved config (3 steps, checkpoint every 2) and the batches of steps 1-3."""
    from toolkit.batches import write_batch
    from toolkit.config.model import RLConfig
    from toolkit.run.layout import RunDir
    from toolkit.run.types import TrainingSample

    run = RunDir(root)
    cfg = RLConfig.model_validate(
        {
            "max_steps": 3,
            "model": {"name": str(tiny_dir)},
            "trainer": {
                "seq_len": 64,
                "micro_batch_size": 1,
                "optim": {"lr": 1e-3},
                "batch_timeout_s": 60,
                "model": {"lora": lora},
            },
            "ckpt": {"interval": 2},
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


@pytest.mark.slow
def test_two_rank_trainer_run_broadcasts_checkpoints_and_resumes(tiny_dir, tmp_path):
    from toolkit.checkpoints import mark_complete_if_ready, part_dir
    from toolkit.trainer.broadcast import is_stable

    run = _trainer_run(tmp_path / "run", tiny_dir)
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


@pytest.mark.slow
def test_two_rank_lora_run_matches_one_rank_and_resumes(tiny_dir, tmp_path):
    """LoRA under FSDP2: the adapters the 2-rank trainer broadcasts equal a 1-rank trainer's on the same batches
    (whole tensors, not shards), and a resume from the DCP checkpoint trains step 3 to the same adapter."""
    from safetensors.torch import load_file

    from toolkit.checkpoints import mark_complete_if_ready, part_dir
    from toolkit.trainer.broadcast import is_stable
    from toolkit.trainer.lora import ADAPTER_WEIGHTS_FILE

    two = _trainer_run(tmp_path / "two", tiny_dir, lora=LORA)
    one = _trainer_run(tmp_path / "one", tiny_dir, lora=LORA)
    _torchrun(["-m", "toolkit.trainer.main", "--run-dir", str(two.root)])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    r = subprocess.run(
        [sys.executable, "-m", "toolkit.trainer.main", "--run-dir", str(one.root)],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert r.returncode == 0, r.stderr[-3000:]

    def adapter(run, step):
        assert is_stable(run.broadcast_step(step))
        return load_file(str(run.broadcast_step(step) / ADAPTER_WEIGHTS_FILE))

    a2, a1 = adapter(two, 3), adapter(one, 3)
    assert set(a2) == set(a1) and all("lora_" in k for k in a1)
    assert all(a2[k].shape == a1[k].shape for k in a1)  # gathered, not one rank's shard
    assert max(float((a2[k] - a1[k]).abs().max()) for k in a1) < 1e-5
    assert any(float(a1[k].abs().max()) > 0 for k in a1 if "lora_B" in k)  # B left zero: nothing was trained

    # Resume the 2-rank run from its COMPLETE step 2: step 3 again, same adapter.
    part_dir(two, 2, "orchestrator").mkdir(parents=True)
    assert mark_complete_if_ready(two, 2)
    shutil.rmtree(two.broadcast_step(3))  # so the adapter compared below is the resumed run's own
    _torchrun(["-m", "toolkit.trainer.main", "--run-dir", str(two.root), "--resume-step", "2"])
    again = adapter(two, 3)
    assert max(float((again[k] - a1[k]).abs().max()) for k in a1) < 1e-5


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    _worker(sys.argv[1:])
