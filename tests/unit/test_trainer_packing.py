"""Packing: rows respect seq_len, no cross-sample attention, packed loss == unpacked loss, rank sharding."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from toolkit.batches import samples_to_batch
from toolkit.models.tiny import build_tiny_model
from toolkit.run.types import TrainingSample
from toolkit.trainer.loss import IPOLoss
from toolkit.trainer.model import load_policy
from toolkit.trainer.packing import RowCost, pack_rows, plan_micro_batches, row_width, rows_per_micro_batch
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


def _first_fit_decreasing(lengths, seq_len):
    """The textbook first-fit decreasing, scanning every open row: the reference for the tree in pack_rows."""
    rows, free = [], []
    for i in sorted(range(len(lengths)), key=lambda j: (-lengths[j], j)):
        r = next((r for r, room in enumerate(free) if lengths[i] <= room), None)
        if r is None:
            rows.append([i])
            free.append(seq_len - lengths[i])
        else:
            rows[r].append(i)
            free[r] -= lengths[i]
    return [rows[r] for r in sorted(range(len(rows)), key=lambda r: (free[r], r))]


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 120).flatmap(lambda s: st.tuples(st.just(s), st.lists(st.integers(1, s), max_size=80))))
def test_pack_rows_is_first_fit_decreasing(case):
    seq_len, lengths = case
    assert pack_rows(lengths, seq_len) == _first_fit_decreasing(lengths, seq_len)


TINY_COST = RowCost(per_token=1.0e6, per_pair=1024.0)  # the tiny model's (RowCost.of_model, checked below)


def test_row_cost_of_the_tiny_model(tiny_dir):
    cost = RowCost.of_model(load_policy(tiny_dir))
    # 2 layers x (q 128x128, k and v 128x64, o 128x128, MLP 3 x 128x512) + LM head 128x101, 2 FLOPs per weight;
    # attention 4 x head_dim 32 x 4 heads x 2 layers per pair.
    assert cost.per_token == 2 * (2 * (128 * 128 * 2 + 128 * 64 * 2 + 3 * 128 * 512) + 128 * 101)
    assert cost.per_pair == 4 * 32 * 4 * 2


def test_short_samples_go_into_narrow_rows_long_ones_fill_seq_len():
    short = [39, 45, 41, 36, 44, 40, 38, 42] * 4  # the README job's RL batch: 32 replies of ~40 tokens
    width = row_width(short, seq_len=512, micro_batch_size=4, world_size=1, cost=TINY_COST)
    assert 45 <= width < 128

    def plan_cost(w):
        used = [sum(short[i] for i in row) for row in pack_rows(short, w)]
        k = rows_per_micro_batch(4, 512, w)
        return sum(TINY_COST.rows(len(c), max(c)) for m in range(0, len(used), k) if (c := used[m : m + k]))

    assert plan_cost(width) < 0.8 * plan_cost(512)
    assert row_width([512, 500, 490], seq_len=512, micro_batch_size=4, world_size=1, cost=TINY_COST) == 512
    long = [400, 380, 350, 120, 100, 90, 60, 30]
    width = row_width(long, seq_len=512, micro_batch_size=4, world_size=1, cost=TINY_COST)
    assert 400 <= width <= 512
    with pytest.raises(ValueError, match="seq_len"):
        row_width([600], seq_len=512, micro_batch_size=4, world_size=1, cost=TINY_COST)


def test_costed_plan_trains_like_the_seq_len_plan(tiny_dir):
    base = load_policy(tiny_dir)
    _, batch = _batch(n=12)
    cost = RowCost.of_model(base)
    results = []
    for c in (None, cost):
        model = copy.deepcopy(base)
        mbs = plan_micro_batches(batch, seq_len=256, micro_batch_size=2, cost=c)
        assert sum(mb.real_tokens for mb in mbs) == batch.num_tokens
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        m = train_step(
            model, opt, None, mbs, loss_cfg=IPOLoss(), max_norm=0.0, num_samples=batch.num_samples, apply_update=False
        )
        results.append(
            (m, {n: p.grad.clone() for n, p in model.named_parameters()}, max(mb.input_ids.shape[1] for mb in mbs))
        )
    (m1, g1, w1), (m2, g2, w2) = results
    assert w2 < w1  # the costed plan really packed narrower rows
    assert m1["loss/mean"] == pytest.approx(m2["loss/mean"], abs=1e-6)
    for name in g1:
        torch.testing.assert_close(g1[name], g2[name], atol=1e-6, rtol=1e-4)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(1, 299), min_size=1, max_size=120),  # + 1 completion token: at most seq_len 300
    st.sampled_from([300, 512, 2048]),
    st.integers(1, 8),
    st.integers(1, 4),
)
def test_costed_plans_keep_the_token_budget_and_never_add_forwards(lengths, seq_len, mbs_rows, world):
    """Narrower rows go several to a micro-batch: no micro-batch holds more than micro_batch_size rows of seq_len
    tokens (padding included), no rank runs more forwards than with seq_len-wide rows, every token is trained once."""
    samples = [TrainingSample([5] * n, [6], [True], [-1.0]) for n in lengths]
    batch = samples_to_batch(
        1, samples, [0.0] * len(samples), policy_versions=[0] * len(samples), envs=["e"] * len(samples)
    )
    plain = [
        plan_micro_batches(batch, seq_len=seq_len, micro_batch_size=mbs_rows, rank=r, world_size=world)
        for r in range(world)
    ]
    costed = [
        plan_micro_batches(batch, seq_len=seq_len, micro_batch_size=mbs_rows, rank=r, world_size=world, cost=TINY_COST)
        for r in range(world)
    ]
    assert len({len(p) for p in costed}) == 1  # FSDP: the same number of forwards on every rank
    assert len(costed[0]) <= len(plain[0])
    assert all(mb.processed_tokens <= mbs_rows * seq_len for p in costed for mb in p)
    assert sum(mb.real_tokens for p in costed for mb in p) == batch.num_tokens
