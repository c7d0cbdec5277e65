"""IPO / IcePop loss against values computed by hand, and normalisation across micro-batches."""

from __future__ import annotations

import math

import pytest
import torch

from toolkit.trainer.loss import IcePopLoss, IPOLoss, mismatch_kl, rl_loss, trust_region_mask


def _lp(probs):
    return torch.log(torch.tensor(probs, dtype=torch.float64)).float()


def test_ipo_mask_at_eps_boundary():
    # mu = 0.5 everywhere; pi moves by 0.29 (kept), 0.31 (masked) up and down. Exactly eps is kept (<= eps);
    # 0.25 = 0.5 - 0.25 is exact in binary floating point, so it tests the boundary itself.
    infer = _lp([0.5, 0.5, 0.5, 0.5, 0.5])
    train = _lp([0.79, 0.81, 0.21, 0.19, 0.25])
    assert trust_region_mask(train, infer, IPOLoss(eps=0.3)).tolist() == [False, True, False, True, False]
    assert trust_region_mask(train, infer, IPOLoss(eps=0.25)).tolist() == [True, True, True, True, False]


def test_icepop_band():
    infer = _lp([0.1, 0.1, 0.1, 0.1, 0.9])
    # ratios 0.15, 0.25, 4.0, 6.0, 0.9/0.9
    train = _lp([0.015, 0.025, 0.4, 0.6, 0.9])
    got = trust_region_mask(train, infer, IcePopLoss(ratio_low=0.2, ratio_high=5.0)).tolist()
    assert got == [True, False, False, True, False]


def test_ipo_and_icepop_disagree_as_documented():
    # The IPO page's examples: 0.01 -> 0.06 (ratio 6) and 0.90 -> 0.20 (moved 0.7 of probability mass).
    infer, train = _lp([0.01, 0.90]), _lp([0.06, 0.20])
    assert trust_region_mask(train, infer, IPOLoss()).tolist() == [False, True]
    assert trust_region_mask(train, infer, IcePopLoss()).tolist() == [True, False]


def test_ipo_loss_value_and_gradient_by_hand():
    infer = _lp([0.5, 0.5, 0.2, 0.4])
    train = _lp([0.6, 0.9, 0.2, 0.3]).requires_grad_(True)  # token 1 moved 0.4 > 0.3: masked
    adv = torch.tensor([1.0, 2.0, -1.0, 0.5])
    loss_mask = torch.tensor([True, True, True, False])  # token 3 is not an RL token
    parts = rl_loss(
        train,
        infer,
        adv,
        loss_mask,
        torch.zeros(4, dtype=torch.bool),
        IPOLoss(eps=0.3, adv_tau=2.0),
        rl_denominator=3,
        ce_denominator=0,
    )
    # kept: token 0 (ratio 1.2, A 1) and token 2 (ratio 1.0, A -1); N = 3 RL tokens including the masked one.
    expected = -(2.0 * 1.0 * 1.2 + 2.0 * -1.0 * 1.0) / 3
    assert parts.loss.item() == pytest.approx(expected, abs=1e-6)
    assert parts.is_masked.tolist() == [False, True, False, False]
    parts.loss.backward()
    # d/d lp of -(tau A exp(lp - ilp))/N = -(tau A ratio)/N on kept tokens, 0 elsewhere.
    assert train.grad.tolist() == pytest.approx([-2.0 * 1.2 / 3, 0.0, 2.0 * 1.0 / 3, 0.0], abs=1e-6)


def test_ce_term_uses_its_own_denominator():
    lp = _lp([0.5, 0.25, 0.125])
    zeros = torch.zeros(3)
    ce = torch.tensor([False, True, True])
    parts = rl_loss(lp, lp, zeros, torch.zeros(3, dtype=torch.bool), ce, IPOLoss(), rl_denominator=0, ce_denominator=2)
    assert parts.loss.item() == pytest.approx((math.log(4) + math.log(8)) / 2, abs=1e-6)


def test_mismatch_kl_zero_when_equal_and_positive_otherwise():
    a = _lp([0.3, 0.5])
    assert mismatch_kl(a, a).abs().max().item() < 1e-7
    r = 0.6 / 0.3
    assert mismatch_kl(_lp([0.6]), _lp([0.3])).item() == pytest.approx(r - 1 - math.log(r), abs=1e-6)


def test_normalisation_across_micro_batches():
    # Splitting tokens into micro-batches with the global denominator gives the same loss and gradient.
    torch.manual_seed(0)
    n = 12
    infer = torch.log(torch.rand(n) * 0.8 + 0.1)
    train = (infer + 0.2 * torch.randn(n)).clamp(max=0).requires_grad_(True)
    adv = torch.randn(n)
    lm = torch.rand(n) > 0.3
    ce = torch.zeros(n, dtype=torch.bool)
    cfg = IPOLoss()
    whole = rl_loss(train, infer, adv, lm, ce, cfg, rl_denominator=int(lm.sum()), ce_denominator=0).loss
    (g_whole,) = torch.autograd.grad(whole, train)
    total = 0.0
    for sl in (slice(0, 5), slice(5, 7), slice(7, 12)):
        total = (
            total
            + rl_loss(
                train[sl], infer[sl], adv[sl], lm[sl], ce[sl], cfg, rl_denominator=int(lm.sum()), ce_denominator=0
            ).loss
        )
    (g_split,) = torch.autograd.grad(total, train)
    assert total.item() == pytest.approx(whole.item(), abs=1e-6)
    torch.testing.assert_close(g_split, g_whole)


def test_mismatch_kl_resolves_fp32_sized_disagreement():
    from toolkit.trainer.loss import mismatch_kl

    lp = torch.tensor([-2.0, -0.5, -7.25])
    d = torch.tensor([2.0**-20, -(2.0**-22), 0.0])  # ~1e-6, ~2e-7: exactly representable offsets
    kl = mismatch_kl(lp + d, lp)
    want = d.double() ** 2 / 2  # k3 = x^2/2 + O(x^3)
    assert kl[2] == 0 and (kl[:2] > 0).all()
    torch.testing.assert_close(kl[:2].double(), want[:2], rtol=1e-3, atol=0)


def test_ref_kl_term_value_and_gradient_by_hand():
    # Four policy tokens distilled towards a teacher. mu = sampler, pi = trainer, ref = teacher (probabilities).
    infer = _lp([0.5, 0.4, 0.6, 0.3])
    train = _lp([0.5, 0.5, 0.3, 0.3]).requires_grad_(True)  # token 2 fell 0.3 > REF_KL_EPS below mu: left out
    ref = _lp([0.25, 0.8, 0.9, 0.3])
    ref_mask = torch.tensor([True, True, True, False])  # token 3 is not a distillation token
    zeros, no = torch.zeros(4), torch.zeros(4, dtype=torch.bool)
    parts = rl_loss(
        train, infer, zeros, no, no, IPOLoss(), rl_denominator=0, ce_denominator=0,
        ref_logprobs=ref, ref_kl_mask=ref_mask, ref_denominator=3,
    )  # fmt: skip
    # kept: token 0 (ratio 1, signal log(0.25/0.5)) and token 1 (ratio 1.25, signal log(0.8/0.5)); N = 3
    s0, s1 = math.log(0.25 / 0.5), math.log(0.8 / 0.5)
    assert parts.loss.item() == pytest.approx(-(s0 * 1.0 + s1 * 1.25) / 3, abs=1e-6)
    assert parts.ref_masked.tolist() == [False, False, True, False]
    assert parts.is_masked.tolist() == [False] * 4  # the RL term's mask is untouched
    # the reverse-KL estimate log pi - log ref on distillation tokens, masked or not; 0 elsewhere
    assert parts.ref_kl.tolist() == pytest.approx([-s0, -s1, math.log(0.3 / 0.9), 0.0], abs=1e-6)
    parts.loss.backward()
    # d/d lp of -(sg(signal) * exp(lp - ilp))/N = -(signal * ratio)/N on kept tokens: the teacher's preference
    # raises token 1 (gradient < 0 on the loss) and lowers token 0.
    assert train.grad.tolist() == pytest.approx([-s0 / 3, -s1 * 1.25 / 3, 0.0, 0.0], abs=1e-6)


def test_ref_kl_importance_ratio_corrects_for_the_sampler():
    # The same trainer, teacher and token; a sampler that drew the token half as likely doubles its weight.
    train, ref = _lp([0.4]).requires_grad_(True), _lp([0.8])
    one, no = torch.ones(1, dtype=torch.bool), torch.zeros(1, dtype=torch.bool)

    def grad(mu: float) -> float:
        train.grad = None
        rl_loss(
            train, _lp([mu]), torch.zeros(1), no, no, IPOLoss(), rl_denominator=0, ce_denominator=0,
            ref_logprobs=ref, ref_kl_mask=one, ref_denominator=1,
        ).loss.backward()  # fmt: skip
        return train.grad.item()

    assert grad(0.2) == pytest.approx(2 * grad(0.4), rel=1e-5)
    assert grad(0.4) == pytest.approx(-math.log(2.0), rel=1e-5)  # on-policy: minus the log-ratio teacher/student


def test_ref_kl_gradient_is_that_of_the_reverse_kl():
    # Exact check of the estimator: over a 3-token vocabulary, the expected gradient of the loss under tokens drawn
    # from pi itself equals the gradient of KL(pi || ref) = sum_y pi(y) (log pi(y) - log ref(y)) w.r.t. the logits.
    logits = torch.tensor([0.3, -0.2, 0.5], dtype=torch.float64, requires_grad=True)
    ref = torch.log(torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64))
    pi = torch.softmax(logits, 0)
    exact = torch.autograd.grad((pi * (torch.log(pi) - ref)).sum(), logits)[0]
    expected = torch.zeros(3, dtype=torch.float64)
    one, no = torch.ones(1, dtype=torch.bool), torch.zeros(1, dtype=torch.bool)
    for y in range(3):
        lp = torch.log_softmax(logits, 0)[y : y + 1]
        loss = rl_loss(
            lp, lp.detach(), torch.zeros(1), no, no, IPOLoss(), rl_denominator=0, ce_denominator=0,
            ref_logprobs=ref[y : y + 1], ref_kl_mask=one, ref_denominator=1,
        ).loss  # fmt: skip
        expected += pi[y].detach() * torch.autograd.grad(loss, logits)[0]
    torch.testing.assert_close(expected, exact, rtol=1e-5, atol=1e-6)


def test_ref_kl_needs_both_inputs():
    x, no = torch.zeros(2), torch.zeros(2, dtype=torch.bool)
    with pytest.raises(ValueError, match="both"):
        rl_loss(x, x, x, no, no, IPOLoss(), rl_denominator=0, ce_denominator=0, ref_logprobs=x)


def test_topk_term_is_the_coarse_grained_reverse_kl_with_its_exact_gradient():
    from toolkit.trainer.loss import topk_reverse_kl

    # a 5-token vocabulary; the reference's top-2 are tokens 0 and 1, the rest is one bucket
    logits = torch.tensor([1.0, 0.2, -0.5, 0.3, 0.0], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([0.6, 0.3, 0.05, 0.03, 0.02], dtype=torch.float64)
    student = torch.log_softmax(logits, 0)
    got = topk_reverse_kl(student[[0, 1]].unsqueeze(0), ref[[0, 1]].log().unsqueeze(0))[0]
    pi = student.exp()
    coarse_pi = torch.stack([pi[0], pi[1], pi[2:].sum()])
    coarse_ref = torch.stack([ref[0], ref[1], ref[2:].sum()])
    want = (coarse_pi * (coarse_pi.log() - coarse_ref.log())).sum()
    assert got.item() == pytest.approx(want.item(), abs=1e-12)
    full = (pi * (pi.log() - ref.log())).sum()
    assert 0 < got.item() <= full.item()  # a lower bound of the full reverse KL
    (g_got,) = torch.autograd.grad(got, logits, retain_graph=True)
    (g_want,) = torch.autograd.grad(want, logits)
    torch.testing.assert_close(g_got, g_want)
    # the loss puts it on distillation tokens with the global denominator
    zeros, no = torch.zeros(2), torch.zeros(2, dtype=torch.bool)
    s2 = torch.stack([student[[0, 1]], student[[0, 1]]]).float()
    r2 = torch.stack([ref[[0, 1]].log(), ref[[0, 1]].log()]).float()
    parts = rl_loss(
        zeros, zeros, zeros, no, no, IPOLoss(), rl_denominator=0, ce_denominator=0,
        ref_logprobs=zeros, ref_kl_mask=torch.tensor([True, False]), ref_denominator=4,
        ref_topk_logprobs=r2, topk_logprobs=s2,
    )  # fmt: skip
    assert parts.loss.item() == pytest.approx(want.item() / 4, abs=1e-6)
    assert parts.ref_kl.tolist() == pytest.approx([want.item(), 0.0], abs=1e-6)


def test_topk_logprobs_align_with_token_positions():
    from toolkit.trainer.step import topk_logprobs

    torch.manual_seed(0)
    logits = torch.randn(2, 4, 7)  # [rows, L-1, V]: position t predicts token t+1
    ids = torch.randint(0, 7, (2, 5, 3))  # [rows, L, K]
    got = topk_logprobs(logits, ids)
    assert got.shape == (2, 5, 3) and not got[:, 0].any()  # column 0 has no context
    want = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:])
    torch.testing.assert_close(got[:, 1:], want)
