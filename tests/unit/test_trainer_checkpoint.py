"""Trainer checkpoint round trip (exact), weight broadcast directory, broadcast retention (field case B18)."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch

from toolkit import checkpoints as ck
from toolkit.batches import samples_to_batch
from toolkit.models.tiny import build_tiny_model
from toolkit.run.layout import RunDir, newest_stable_broadcast
from toolkit.run.types import TrainingSample
from toolkit.trainer import broadcast as bc
from toolkit.trainer.checkpoint import load_trainer_state, save_trainer_state
from toolkit.trainer.loss import IPOLoss
from toolkit.trainer.model import full_state_dict, load_policy
from toolkit.trainer.optim import build_optimizer, build_scheduler
from toolkit.trainer.packing import plan_micro_batches
from toolkit.trainer.step import train_step


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


def _batch(step):
    rng = np.random.default_rng(step)
    samples = [
        TrainingSample(
            rng.integers(4, 100, 4).tolist(),
            rng.integers(4, 100, 8).tolist(),
            [True] * 8,
            (-rng.random(8) * 3).tolist(),
        )
        for _ in range(4)
    ]
    return samples_to_batch(step, samples, rng.normal(size=4).tolist(), policy_versions=[0] * 4, envs=["e"] * 4)


def _setup(tiny_dir):
    model = load_policy(tiny_dir)
    opt = build_optimizer(model, lr=1e-3, weight_decay=0.01, betas=(0.9, 0.99))
    sched = build_scheduler(opt, kind="linear_warmup", warmup_steps=5)
    return model, opt, sched


def _step(model, opt, sched, step):
    b = _batch(step)
    mbs = plan_micro_batches(b, seq_len=32, micro_batch_size=1)
    return train_step(model, opt, sched, mbs, loss_cfg=IPOLoss(), max_norm=1.0, num_samples=b.num_samples)


def test_round_trip_is_exact(tiny_dir, tmp_path):
    run = RunDir(tmp_path / "run")
    torch.manual_seed(0)
    model, opt, sched = _setup(tiny_dir)
    for s in (1, 2):
        _step(model, opt, sched, s)
    part = save_trainer_state(run, 2, model, opt, sched)
    assert part == run.checkpoint_step(2) / "trainer"
    assert not ck.mark_complete_if_ready(run, 2)  # orchestrator part missing: not complete
    m3 = _step(model, opt, sched, 3)
    after = {k: v.clone() for k, v in model.state_dict().items()}
    rng_after = torch.rand(3)

    model2, opt2, sched2 = _setup(tiny_dir)
    assert load_trainer_state(part, model2, opt2, sched2) == 2
    assert sched2.last_epoch == 2
    m3b = _step(model2, opt2, sched2, 3)
    assert m3b["loss/mean"] == m3["loss/mean"]
    assert m3b["optim/lr"] == m3["optim/lr"]
    for k, v in model2.state_dict().items():
        assert torch.equal(v, after[k]), k
    assert torch.equal(torch.rand(3), rng_after)


def test_optimizer_moments_are_safetensors_and_the_older_layout_still_loads(tiny_dir, tmp_path):
    torch.manual_seed(0)
    model, opt, sched = _setup(tiny_dir)
    _step(model, opt, sched, 1)
    part = save_trainer_state(RunDir(tmp_path / "new"), 1, model, opt, sched)
    assert (part / "optimizer.safetensors").stat().st_size > (part / "optimizer.pt").stat().st_size
    # A checkpoint written before the split: the whole optimizer state pickled in optimizer.pt.
    old = tmp_path / "old_part"
    old.mkdir()
    for f in ("model.safetensors", "trainer_state.pt"):
        (old / f).write_bytes((part / f).read_bytes())
    torch.save(opt.state_dict(), old / "optimizer.pt")
    for source in (part, old):
        model2, opt2, sched2 = _setup(tiny_dir)
        load_trainer_state(source, model2, opt2, sched2)
        want, got = opt.state_dict()["state"], opt2.state_dict()["state"]
        assert want.keys() == got.keys()
        for pid in want:
            for key in want[pid]:
                assert torch.equal(want[pid][key], got[pid][key]), (source.name, pid, key)


def test_load_into_an_optimizer_with_state_overwrites_its_tensors_in_place(tiny_dir, tmp_path):
    torch.manual_seed(0)
    model, opt, sched = _setup(tiny_dir)
    _step(model, opt, sched, 1)
    part = save_trainer_state(RunDir(tmp_path / "run"), 1, model, opt, sched)
    saved = {pid: {k: v.clone() for k, v in st.items()} for pid, st in opt.state_dict()["state"].items()}
    m2 = _step(model, opt, sched, 2)  # moves every moment away from the saved values
    before = {(pid, k): v.data_ptr() for pid, st in opt.state_dict()["state"].items() for k, v in st.items()}
    load_trainer_state(part, model, opt, sched)
    got = opt.state_dict()["state"]
    for pid, st in saved.items():
        for k, v in st.items():
            assert torch.equal(got[pid][k], v), (pid, k)
            assert got[pid][k].data_ptr() == before[(pid, k)], (pid, k)  # same memory, no second allocation
    assert _step(model, opt, sched, 2)["loss/mean"] == m2["loss/mean"]


def test_broadcast_is_a_loadable_hf_dir(tiny_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    run = RunDir(tmp_path / "run")
    model, opt, sched = _setup(tiny_dir)
    _step(model, opt, sched, 1)
    path = bc.write_broadcast(run, 1, full_state_dict(model), bc.model_config_dict(model), tiny_dir)
    assert bc.is_stable(path) and newest_stable_broadcast(run) == (1, path)  # what engines look for
    names = {p.name for p in path.iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json", "STABLE"} <= names
    assert json.loads((path / "config.json").read_text())["tie_word_embeddings"] is False
    loaded = AutoModelForCausalLM.from_pretrained(path)
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits)
    assert loaded.lm_head.weight.data_ptr() != loaded.get_input_embeddings().weight.data_ptr()


def test_untie_gives_separate_lm_head(tmp_path):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from toolkit.trainer.model import untie_output_embeddings

    cfg = Qwen3Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        tie_word_embeddings=True,
    )
    model = Qwen3ForCausalLM(cfg)
    assert model.lm_head.weight is model.get_input_embeddings().weight
    assert untie_output_embeddings(model)
    assert model.lm_head.weight is not model.get_input_embeddings().weight
    torch.testing.assert_close(model.lm_head.weight, model.get_input_embeddings().weight)
    assert model.config.tie_word_embeddings is False
    with torch.no_grad():
        model.lm_head.weight.add_(1.0)
    assert not torch.equal(model.lm_head.weight, model.get_input_embeddings().weight)


def _fake_broadcast(run, step, stable=True):
    # Retention reads only directory names and markers; a weights file is not needed to test it.
    d = run.broadcast_step(step)
    d.mkdir(parents=True)
    if stable:
        (d / "STABLE").write_bytes(b"")


def test_b18_retention_follows_async_window(tmp_path):
    run = RunDir(tmp_path / "run")
    # max_async_level 8 with keep=2 configured: the floor of 9 wins.
    keep = bc.broadcast_keep(max_async_level=8, keep=2)
    assert keep == 9
    for s in range(1, 12):
        _fake_broadcast(run, s)
    _fake_broadcast(run, 12, stable=False)  # being written
    res = bc.apply_broadcast_retention(run, keep)
    assert res.deleted == [1, 2]
    from toolkit.run.layout import numbered_steps

    assert numbered_steps(run.broadcasts) == list(range(3, 13))


def test_broadcast_retention_waits_for_newer_stable(tmp_path):
    run = RunDir(tmp_path / "run")
    _fake_broadcast(run, 1)
    _fake_broadcast(run, 2)
    _fake_broadcast(run, 3, stable=False)
    assert bc.apply_broadcast_retention(run, 2).deleted == []  # only 2 STABLE: nothing goes yet


def test_broadcast_deletion_failure_is_a_warning(tmp_path, monkeypatch, caplog):
    run = RunDir(tmp_path / "run")
    for s in (1, 2, 3):
        _fake_broadcast(run, s)

    def boom(path, *a, **k):  # fault injection: NFS "directory not empty"
        if not k.get("ignore_errors"):
            raise OSError(39, "Directory not empty")

    monkeypatch.setattr(bc.shutil, "rmtree", boom)
    with caplog.at_level(logging.WARNING):
        res = bc.apply_broadcast_retention(run, 2)
    assert res.failed == [1] and "could not delete" in caplog.text
