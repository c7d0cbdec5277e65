"""RL loss of the trainer: IPO (default) or IcePop for the RL term, plus an optional CE term.

Source: prime-rl's documentation, pages "Algorithms § Loss" (docs.primeintellect.ai/
prime-rl/algorithms#loss, the three-component sum with one global token count per component) and "IPO"
(docs.primeintellect.ai/prime-rl/ipo, masking by probability instead of ratio). With pi the trainer policy, mu the
policy that sampled the rollout (its logprobs come with the batch), A_t the token advantage and N the global count
of RL tokens (all ranks, all micro-batches):

    IPO:     L = -(1/N) * sum_t 1(|pi(y_t) - mu(y_t)| <= eps)            * adv_tau * A_t * pi(y_t) / mu(y_t)
    IcePop:  L = -(1/N) * sum_t 1(ratio_low <= pi(y_t)/mu(y_t) <= ratio_high) * adv_tau * A_t * pi(y_t) / mu(y_t)
    CE:      L_ce = -(1/N_ce) * sum_t ce_mask_t * log pi(y_t)
    ref-KL:  L_ref = -(1/N_ref) * sum_t 1(pi(y_t) - mu(y_t) >= -REF_KL_EPS) * sg(log ref(y_t) - log pi(y_t))
                                                                            * pi(y_t) / mu(y_t)

The ref-KL term is on-policy distillation (``opd``): the per-token reverse KL to a reference model ``ref`` (a
teacher scoring the sampled tokens) is the policy-gradient signal in place of an advantage (Thinking Machines Lab,
"On-Policy Distillation", 2025; the component layout and the one-sided trust region follow prime-rl's
Algorithms page, § Loss). Its gradient, ``(1/N_ref) sum_t ratio_t * (log pi - log ref) * d log pi``, is the
importance-weighted score-function estimate of the gradient of KL(pi || ref) over the sampled tokens. The trust
region is one-sided: a token whose probability already fell more than ``REF_KL_EPS`` below the sampler's is left
out, so a teacher that dislikes a token cannot push it towards zero in one step; a rise is not bounded, since
the teacher's signal there is what distillation wants.

With top-k distillation (``algo.top_k`` = K) the reference sends its K most likely tokens S_t at each position
and the ref-KL term is the reverse KL itself, computed exactly over S_t plus one bucket for the rest of the
vocabulary (no sampled-token estimate, so no importance ratio and no trust region):

    L_ref = (1/N_ref) * sum_t [ sum_{v in S_t} pi(v) (log pi(v) - log ref(v))
                                + pi(~S_t) (log pi(~S_t) - log ref(~S_t)) ]

with pi(~S_t) = 1 - sum_{v in S_t} pi(v) (likewise for ref), both kept above 1e-12. It is the KL between the two
distributions coarse-grained to K + 1 outcomes, a lower bound of the full reverse KL that equals it when the
reference puts all its mass on S_t; its gradient has no sampling noise, which is what a weak student needs (a
one-sample estimate from a near-uniform policy mostly pushes down tokens it will rarely sample again).

The masks are computed without gradient; the ratio carries the gradient (d ratio = ratio * d log pi). Masked
tokens still count in N (the mask sits inside the sum), so masking lowers the step size instead of reweighting.
The total loss is ``L + L_ce + L_ref``; each term uses its own denominator so one does not dilute the other.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from toolkit.config.model import IcePopLoss, IPOLoss

# The loss settings are the config's classes, so their defaults are defined once: eps, ratio_low/high, adv_tau.
LossConfig = IPOLoss | IcePopLoss
# One-sided trust region of the ref-KL term: absolute probability drop (pi - mu) beyond which a token is left out.
REF_KL_EPS = 0.2


@dataclass
class LossParts:
    """Loss of one micro-batch and the per-token tensors the step aggregates into metrics.

    ``loss`` (scalar) is already divided by the global denominators: summing it over micro-batches and ranks
    gives the step loss. ``is_masked`` (bool, RL tokens the trust region left out), ``ref_masked`` (bool, the same
    for ref-KL tokens), ``mismatch_kl`` (float32, 0 off the policy tokens of both terms) and ``ref_kl`` (float32,
    ``log pi - log ref`` on ref-KL tokens, 0 elsewhere: the per-token reverse-KL estimate) have the inputs' shape
    and no gradient; they stay tensors so that no device sync happens per micro-batch.
    """

    loss: torch.Tensor
    is_masked: torch.Tensor
    mismatch_kl: torch.Tensor
    ref_masked: torch.Tensor
    ref_kl: torch.Tensor


def trust_region_mask(
    trainer_logprobs: torch.Tensor, inference_logprobs: torch.Tensor, cfg: LossConfig
) -> torch.Tensor:
    """Bool tensor (same shape as the inputs) that is True where a token is masked out of the RL term.

    IPO: ``|exp(lp_train) - exp(lp_infer)| > eps``; IcePop: ``exp(lp_train - lp_infer)`` outside
    ``[ratio_low, ratio_high]``. Both boundaries are kept (not masked), as in the formulas above.
    """
    lp = trainer_logprobs.detach().float()
    ilp = inference_logprobs.float()
    if isinstance(cfg, IPOLoss):
        return (lp.exp() - ilp.exp()).abs() > cfg.eps
    if isinstance(cfg, IcePopLoss):
        ratio = (lp - ilp).exp()
        return (ratio < cfg.ratio_low) | (ratio > cfg.ratio_high)
    raise TypeError(f"unknown loss config {cfg!r}")


def mismatch_kl(trainer_logprobs: torch.Tensor, inference_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token estimate of KL(mu || pi) on tokens sampled from mu: ``r - 1 - log r`` with ``r = pi/mu``.

    This is the non-negative "k3" estimator (J. Schulman, "Approximating KL Divergence", 2020); it is 0 exactly
    when trainer and inference agree on the token. No gradient. Computed in float64 with ``expm1`` and returned as
    float32: in float32, ``exp(x) - 1 - x`` cancels to exactly 0 for |x| below ~1e-4, which would hide the ~1e-7
    logprob differences that fp32 inference and training actually show.
    """
    log_r = trainer_logprobs.detach().double() - inference_logprobs.double()
    return (torch.expm1(log_r) - log_r).float()


def rl_loss(
    trainer_logprobs: torch.Tensor,
    inference_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    ce_mask: torch.Tensor,
    cfg: LossConfig,
    *,
    rl_denominator: float,
    ce_denominator: float,
    ref_logprobs: torch.Tensor | None = None,
    ref_kl_mask: torch.Tensor | None = None,
    ref_denominator: float = 0.0,
    ref_topk_logprobs: torch.Tensor | None = None,
    topk_logprobs: torch.Tensor | None = None,
) -> LossParts:
    """Loss of one micro-batch (any shape, all inputs the same shape; logprobs in nats).

    ``rl_denominator`` / ``ce_denominator`` / ``ref_denominator`` are the global counts of ``loss_mask`` /
    ``ce_mask`` / ``ref_kl_mask`` tokens over every micro-batch and rank of the step (a count of 0 is treated as 1:
    the term is then 0). ``ref_logprobs`` and ``ref_kl_mask`` (both or neither) add the ref-KL term of the module
    doc; with ``ref_topk_logprobs`` (the reference's top-K logprobs, ``[..., K]``) and ``topk_logprobs`` (the
    trainer's logprobs of the same tokens, with gradient) it is the exact top-K form. Returns :class:`LossParts`;
    ``loss`` has a gradient through ``trainer_logprobs`` (and ``topk_logprobs``). Raises ValueError when only one of
    a pair is given.
    """
    if (ref_logprobs is None) != (ref_kl_mask is None):
        raise ValueError("the ref-KL term needs both ref_logprobs and ref_kl_mask")
    if (ref_topk_logprobs is None) != (topk_logprobs is None):
        raise ValueError("top-k distillation needs both ref_topk_logprobs and topk_logprobs")
    lp = trainer_logprobs.float()
    ilp = inference_logprobs.float()
    zeros = torch.zeros_like(lp)
    rl_mask = loss_mask.bool()
    masked = trust_region_mask(lp, ilp, cfg) & rl_mask
    keep = rl_mask & ~masked
    ratio = torch.exp(lp - ilp)
    pg = -(cfg.adv_tau * advantages.float() * ratio)
    loss = torch.where(keep, pg, zeros).sum() / max(float(rl_denominator), 1.0)
    ce = ce_mask.bool()
    loss = loss + torch.where(ce, -lp, zeros).sum() / max(float(ce_denominator), 1.0)
    policy = rl_mask
    ref_masked = torch.zeros_like(rl_mask)
    ref_kl = zeros.detach()
    if ref_kl_mask is not None and topk_logprobs is not None and ref_topk_logprobs is not None:
        ref_mask = ref_kl_mask.bool()
        policy = rl_mask | ref_mask
        kl = topk_reverse_kl(topk_logprobs.float(), ref_topk_logprobs.float())
        ref_kl = torch.where(ref_mask, kl, zeros).detach()
        loss = loss + torch.where(ref_mask, kl, zeros).sum() / max(float(ref_denominator), 1.0)
    elif ref_kl_mask is not None and ref_logprobs is not None:
        ref_mask = ref_kl_mask.bool()
        policy = rl_mask | ref_mask
        with torch.no_grad():
            ref_masked = ((lp.exp() - ilp.exp()) < -REF_KL_EPS) & ref_mask
            ref_kl = torch.where(ref_mask, lp - ref_logprobs.float(), zeros)
        signal = (ref_logprobs.float() - lp).detach()  # -(reverse-KL per token): the "advantage" of distillation
        ref_term = torch.where(ref_mask & ~ref_masked, -(signal * ratio), zeros).sum()
        loss = loss + ref_term / max(float(ref_denominator), 1.0)
    kl = torch.where(policy, mismatch_kl(lp, ilp), zeros)
    return LossParts(loss=loss, is_masked=masked, mismatch_kl=kl, ref_masked=ref_masked, ref_kl=ref_kl.detach())


def topk_reverse_kl(student: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """Per-position reverse KL over the reference's top-K tokens plus one bucket for the rest (module doc), in nats.

    ``student`` / ``reference``: logprobs of the same K tokens at each position, ``[..., K]``; returns ``[...]``,
    with gradient through ``student``. Non-negative up to rounding.
    """
    p = student.exp()
    tail_p = (1.0 - p.sum(-1)).clamp(min=1e-12)
    tail_r = (1.0 - reference.exp().sum(-1)).clamp(min=1e-12)
    return (p * (student - reference)).sum(-1) + tail_p * (tail_p.log() - tail_r.log())
