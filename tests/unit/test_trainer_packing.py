"""Packing: rows respect seq_len, no cross-sample attention, packed loss == unpacked loss, rank sharding."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from toolkit.batches import samples_to_batch
from toolkit.models.tiny import build_tiny_model
from toolkit.run.types import TrainingSample
from toolkit.trainer.loss import IPOLoss
from toolkit.trainer.model import load_policy
from toolkit.trainer.packing import pack_rows, plan_micro_batches
from toolkit.trainer.step import token_logprobs, train_step


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


def _batch(seed=0, n=6, vocab=101):
    rng = np.random.default_rng(seed)
    samples, adv = [], []
    for _ in range(n):
        p, c = int(rng.integers(2, 9)), int(rng.integers(1, 12))
        mask = (rng.random(c) > 0.2).tolist()
        lps = np.where(mask, -rng.random(c) * 4 - 0.5, 0.0).tolist()  # far from the model: some IPO masking
        samples.append(
            TrainingSample(rng.integers(4, vocab, p).tolist(), rng.integers(4, vocab, c).tolist(), mask, lps)
        )
        adv.append(float(rng.normal()))
    return samples, samples_to_batch(1, samples, adv, policy_versions=[0] * n, envs=["e"] * n)


def test_pack_rows_first_fit_decreasing():
    rows = pack_rows([5, 3, 4, 2, 6], seq_len=8)
    assert sorted(i for r in rows for i in r) == [0, 1, 2, 3, 4]
    assert all(sum([5, 3, 4, 2, 6][i] for i in r) <= 8 for r in rows)
    assert len(rows) == 3  # 20 tokens need at least 3 rows of 8
    with pytest.raises(ValueError, match="seq_len"):
        pack_rows([9], seq_len=8)


def test_micro_batches_cover_every_token_once_and_mask_sample_starts():
    _, batch = _batch(n=9)
    mbs = plan_micro_batches(batch, seq_len=24, micro_batch_size=2)
    assert sum(mb.real_tokens for mb in mbs) == batch.num_tokens
    idx = torch.cat([mb.sample_index.flatten() for mb in mbs])
    assert sorted(set(idx.tolist()) - {-1}) == list(range(batch.num_samples))
    for mb in mbs:
        assert mb.input_ids.shape[1] <= 24
        starts = mb.position_ids == 0
        assert not (mb.loss_mask & starts).any()
        assert not mb.loss_mask[mb.sample_index < 0].any()
    assert sum(int(mb.loss_mask.sum()) for mb in mbs) == int(batch.loss_mask.sum())
    assert 0 < sum(mb.real_tokens for mb in mbs) / sum(mb.processed_tokens for mb in mbs) <= 1  # packing efficiency


def test_ranks_get_equal_micro_batch_counts_and_disjoint_rows():
    _, batch = _batch(n=7)
    per_rank = [plan_micro_batches(batch, seq_len=20, micro_batch_size=1, rank=r, world_size=3) for r in range(3)]
    assert len({len(m) for m in per_rank}) == 1
    seen = [i for m in per_rank for mb in m for i in mb.sample_index.unique().tolist() if i >= 0]
    assert sorted(seen) == list(range(batch.num_samples))


def test_no_cross_sample_attention(tiny_dir):
    model = load_policy(tiny_dir)
    samples, batch = _batch(n=4)
    packed = plan_micro_batches(batch, seq_len=64, micro_batch_size=1)
    assert len(packed) == 1 and packed[0].input_ids.shape[0] == 1  # all four in one row
    with torch.no_grad():
        lp_packed, _ = token_logprobs(model, packed[0], with_entropy=False)
        for i in range(batch.num_samples):
            single = samples_to_batch(1, [samples[i]], [0.0], policy_versions=[0], envs=["e"])
            (mb,) = plan_micro_batches(single, seq_len=64, micro_batch_size=1)
            lp_alone, _ = token_logprobs(model, mb, with_entropy=False)
            got = lp_packed[packed[0].sample_index == i]
            torch.testing.assert_close(got[1:], lp_alone[0, 1:], atol=1e-5, rtol=1e-5)


def test_packed_step_equals_unpacked_step(tiny_dir):
    base = load_policy(tiny_dir)
    _, batch = _batch(n=8)
    results = []
    for seq_len, mbs_rows in ((64, 2), (batch.lengths.max(), 1)):  # packed rows vs about one sample per row
        model = copy.deepcopy(base)
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        mbs = plan_micro_batches(batch, seq_len=int(seq_len), micro_batch_size=mbs_rows)
        m = train_step(
            model, opt, None, mbs, loss_cfg=IPOLoss(), max_norm=0.0, num_samples=batch.num_samples, apply_update=False
        )
        results.append((m, {n: p.grad.clone() for n, p in model.named_parameters()}, len(mbs)))
    (m1, g1, n1), (m2, g2, n2) = results
    assert n1 < n2  # the packed plan really used fewer forwards
    assert m1["loss/mean"] == pytest.approx(m2["loss/mean"], abs=1e-6)
    assert m1["is_masked/mean"] == pytest.approx(m2["is_masked/mean"])
    assert m1["mismatch_kl/max"] == pytest.approx(m2["mismatch_kl/max"], rel=1e-5)
    for name in g1:
        torch.testing.assert_close(g1[name], g2[name], atol=1e-6, rtol=1e-4)
