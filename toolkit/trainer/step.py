"""One RL train step: forward/backward over the micro-batches, clip, optimizer and scheduler step, metrics.

The loss of every micro-batch is divided by the *global* number of RL (and CE) tokens of the step, counted over
all micro-batches and ranks before the first forward, so the result does not depend on how samples were packed
or sharded (see ``loss.py`` for the formulas and their sources). FSDP averages gradients over ranks; the step
multiplies each rank's loss by the world size so the reduced gradient is the gradient of the global sum.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from toolkit.trainer.loss import LossConfig, rl_loss
from toolkit.trainer.packing import MicroBatch


@dataclass(frozen=True)
class DistInfo:
    """Rank layout of the trainer: ``world_size`` 1 means no torch.distributed calls at all."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def token_logprobs(
    model: torch.nn.Module, mb: MicroBatch, *, with_entropy: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprob (nats, float32, with gradient) of every token of ``mb`` given the tokens before it, ``[rows, L]``.

    Column 0 (no context) is 0. The logprobs are those of the distribution the inference engine sampled from
    (``mb.temperature``, ``mb.top_k``, ``mb.top_p``, as vLLM processes them): logits divided by the temperature,
    then kept to the ``top_k`` largest, then to the smallest high-probability set holding ``top_p`` of that mass, and
    renormalised over what is kept. Also returns the per-position entropy (nats, no gradient) of the same
    distribution at the position that predicts each token, or None if not requested.
    """
    return logprobs_from_logits(scaled_logits(model, mb), mb, with_entropy=with_entropy)


def scaled_logits(model: torch.nn.Module, mb: MicroBatch) -> torch.Tensor:
    """The model's next-token logits for ``mb`` divided by its sampling temperature, float32 ``[rows, L-1, V]``
    (position t predicts token t+1), with gradient."""
    logits = model(input_ids=mb.input_ids, position_ids=mb.position_ids, use_cache=False).logits
    logits = logits[:, :-1].float()
    return logits / mb.temperature if mb.temperature != 1.0 else logits


def logprobs_from_logits(
    logits: torch.Tensor, mb: MicroBatch, *, with_entropy: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`token_logprobs` from :func:`scaled_logits` (the model's forward done once by the caller)."""
    targets = mb.input_ids[:, 1:]
    if mb.top_k or mb.top_p < 1.0:
        lp, ent = _truncated_logprobs(logits, targets, mb.top_k, mb.top_p, with_entropy)
    else:
        lse = torch.logsumexp(logits, dim=-1)
        lp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
        ent = None
        if with_entropy:
            with torch.no_grad():
                ent = lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    lp = torch.nn.functional.pad(lp, (1, 0))
    entropy = torch.nn.functional.pad(ent, (1, 0)) if ent is not None else None
    return lp, entropy


def topk_logprobs(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Logprobs (with gradient) of the token ids ``ids`` ``[rows, L, K]`` at each position under the temperature-
    scaled distribution of ``logits`` (:func:`scaled_logits`), aligned like :func:`token_logprobs`: entry
    ``[r, t, j]`` is the logprob of ``ids[r, t, j]`` as token t given the tokens before it (column 0: zeros)."""
    # gather, then normalise: no second [rows, L, V] tensor (a full log_softmax would be one per micro-batch)
    lp = logits.gather(-1, ids[:, 1:].long()) - torch.logsumexp(logits, dim=-1, keepdim=True)
    return torch.nn.functional.pad(lp, (0, 0, 1, 0))


def _truncated_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, top_k: int, top_p: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Target logprobs (and entropy) under top-k then top-p truncation of ``logits`` ``[rows, L, V]``."""
    vocab = logits.shape[-1]
    vals, idx = logits.topk(top_k if 0 < top_k < vocab else vocab, dim=-1)  # descending
    keep = torch.ones_like(vals, dtype=torch.bool)
    if top_p < 1.0:
        with torch.no_grad():
            # vLLM drops the least likely tokens while their summed probability stays <= 1 - top_p; the most
            # likely token always stays. ``below`` is the mass of a token and of every token less likely.
            below = vals.softmax(-1).flip(-1).cumsum(-1).flip(-1)
            keep = below > 1.0 - top_p
            keep[..., 0] = True
    kept = vals.masked_fill(~keep, float("-inf"))
    lse_kept = torch.logsumexp(kept, dim=-1)
    ent = None
    if with_entropy:
        with torch.no_grad():
            p = torch.softmax(kept, dim=-1)
            ent = lse_kept - torch.where(keep, p * vals, torch.zeros_like(vals)).sum(-1)
    target_logit = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    # The trainer's logits are not bit-identical to the engine's: a sampled token just outside the kept set here
    # joins it, so its logprob stays finite (and close to the engine's) instead of -inf.
    inside = ((idx == targets.unsqueeze(-1)) & keep).any(-1)
    lse = torch.where(inside, lse_kept, torch.logaddexp(lse_kept, target_logit))
    return target_logit - lse, ent


def _all_reduce_sum(t: torch.Tensor, info: DistInfo) -> torch.Tensor:
    if info.world_size > 1:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def _max_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    micro_batches: list[MicroBatch],
    *,
    loss_cfg: LossConfig,
    max_norm: float,
    num_samples: int,
    info: DistInfo = DistInfo(),
    device: torch.device | str = "cpu",
    apply_update: bool = True,
    on_policy: torch.Tensor | None = None,
) -> dict[str, float]:
    """Run one step over this rank's ``micro_batches`` and return the step's metrics (global over ranks).

    ``num_samples`` is the number of samples in the whole batch (``sample_index`` values are below it).
    ``max_norm`` clips the global gradient L2 norm (<= 0 disables clipping; the norm is still reported).
    With ``apply_update=False`` the gradients are left in the parameters (tests compare them) and neither the
    optimizer nor the scheduler steps. When the global loss or gradient norm is not finite the update is skipped
    (gradients dropped, weights, optimizer and schedule unchanged) and ``optim/skipped_update`` is 1. Metrics:
    loss/mean, entropy/mean, mismatch_kl/{mean,max} (per-sample means over the policy's tokens, then mean/max over
    samples), is_masked/mean, and when some sample distils (ref-KL tokens): ref_kl/mean (mean over those tokens of
    the reverse-KL estimate: log pi - log ref, or the exact top-K form), ref_kl/is_masked, train/ref_kl_tokens;
    optim/grad_norm, optim/lr, perf/throughput (real tokens/s), perf/peak_memory (bytes), perf/packing_efficiency,
    time/step (s).

    ``on_policy`` (bool ``[num_samples]``) marks samples generated by exactly the weights the trainer holds now.
    mismatch_kl is then taken over those samples only: it measures trainer-vs-inference disagreement on the same
    weights (a weight-sync or numerics problem). Samples from older policies (async, ``max_async_level`` > 0)
    also differ by the updates since; their KL is reported apart as off_policy_kl/mean.
    """
    device = torch.device(device)
    t0 = time.perf_counter()
    model.train()
    mbs = [mb.to(device) for mb in micro_batches]
    f32 = {"device": device, "dtype": torch.float32}
    # Global denominators first: every micro-batch's loss is divided by the same counts.
    counts = torch.tensor(
        [sum(float(getattr(mb, m).sum()) for mb in mbs) for m in ("loss_mask", "ce_mask", "ref_kl_mask")], **f32
    )
    n_rl, n_ce, n_ref = _all_reduce_sum(counts, info).tolist()
    distill = n_ref > 0  # the ref-KL term only when some env distils: a plain RL step runs as before
    loss_sum = torch.zeros((), **f32)
    entropy_sum = torch.zeros((), **f32)
    masked_sum = torch.zeros((), **f32)
    ref_sums = torch.zeros(2, **f32)  # sum over ref-KL tokens of (log pi - log ref), of trust-region exclusions
    kl_per_sample = torch.zeros(num_samples + 1, **f32)  # last slot collects padding (index -1)
    tok_per_sample = torch.zeros(num_samples + 1, **f32)
    real, processed = 0, 0
    for mb in mbs:
        logits = scaled_logits(model, mb)  # under the batch's sampling, which each micro-batch carries
        lp, ent = logprobs_from_logits(logits, mb)
        topk = distill and mb.ref_topk_ids.shape[-1] > 0
        student_topk = topk_logprobs(logits, mb.ref_topk_ids) if topk else None
        del logits
        parts = rl_loss(
            lp,
            mb.inference_logprobs,
            mb.advantages,
            mb.loss_mask,
            mb.ce_mask,
            loss_cfg,
            rl_denominator=n_rl,
            ce_denominator=n_ce,
            ref_logprobs=mb.ref_logprobs if distill else None,
            ref_kl_mask=mb.ref_kl_mask if distill else None,
            ref_denominator=n_ref,
            ref_topk_logprobs=mb.ref_topk_logprobs if topk else None,
            topk_logprobs=student_topk,
        )
        (parts.loss * info.world_size).backward()
        with torch.no_grad():
            lm = mb.loss_mask | mb.ref_kl_mask  # the policy's own tokens, whichever term trains them
            loss_sum += parts.loss.detach()
            ref_sums += torch.stack([parts.ref_kl.sum(), parts.ref_masked.sum().float()])
            entropy_sum += torch.where(lm, ent, torch.zeros_like(ent)).sum()
            masked_sum += parts.is_masked.sum()
            idx = torch.where(mb.sample_index >= 0, mb.sample_index, num_samples).flatten()
            kl_per_sample.index_add_(0, idx, parts.mismatch_kl.flatten())
            tok_per_sample.index_add_(0, idx, lm.flatten().float())
        real += mb.real_tokens
        processed += mb.processed_tokens
    stats = _all_reduce_sum(
        torch.cat([torch.stack([loss_sum, entropy_sum, masked_sum]), ref_sums, torch.tensor([real, processed], **f32)]),
        info,
    )
    kl_per_sample = _all_reduce_sum(kl_per_sample, info)[:num_samples]
    tok_per_sample = _all_reduce_sum(tok_per_sample, info)[:num_samples]
    params = [p for p in model.parameters() if p.requires_grad]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"))
    if hasattr(grad_norm, "full_tensor"):  # DTensor under FSDP2
        grad_norm = grad_norm.full_tensor()
    lr = float(optimizer.param_groups[0]["lr"])
    # A NaN/inf loss or gradient would poison the weights (and, through the broadcast, every engine) for good: skip
    # the update instead. Both figures are global (all-reduced), so every rank takes the same decision.
    finite = math.isfinite(float(stats[0])) and math.isfinite(float(grad_norm))
    if apply_update:
        if finite:
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
        optimizer.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - t0
    loss_v, ent_v, masked_v, ref_kl_v, ref_masked_v, real_v, processed_v = stats.tolist()
    has = tok_per_sample > 0
    fresh = has if on_policy is None else has & on_policy.to(has.device)
    stale = has & ~fresh
    kl_means = kl_per_sample[fresh] / tok_per_sample[fresh]
    kl_stale = kl_per_sample[stale] / tok_per_sample[stale]
    extra = {"off_policy_kl/mean": float(kl_stale.mean())} if kl_stale.numel() else {}
    if kl_means.numel():
        extra.update({"mismatch_kl/mean": float(kl_means.mean()), "mismatch_kl/max": float(kl_means.max())})
    if distill:
        extra.update(
            {
                "ref_kl/mean": ref_kl_v / n_ref,
                "ref_kl/is_masked": ref_masked_v / n_ref,
                "train/ref_kl_tokens": n_ref,
            }
        )
    return {
        **extra,
        "loss/mean": loss_v,
        "entropy/mean": ent_v / max(n_rl + n_ref, 1.0),
        "is_masked/mean": masked_v / max(n_rl, 1.0),
        "optim/grad_norm": float(grad_norm),
        "optim/lr": lr,
        "optim/skipped_update": 0.0 if finite else 1.0,
        "perf/throughput": real_v / elapsed if elapsed > 0 else 0.0,
        "perf/peak_memory": float(_max_memory_bytes(device)),
        "perf/packing_efficiency": real_v / processed_v if processed_v else 1.0,
        "train/rl_tokens": n_rl,
        "train/real_tokens": real_v,
        "time/step": elapsed,
    }
