"""One RL train step: forward/backward over the micro-batches, clip, optimizer and scheduler step, metrics.

The loss of every micro-batch is divided by the *global* number of RL (and CE) tokens of the step, counted over
all micro-batches and ranks before the first forward, so the result does not depend on how samples were packed
or sharded (see ``loss.py`` for the formulas and their sources). FSDP averages gradients over ranks; the step
multiplies each rank's loss by the world size so the reduced gradient is the gradient of the global sum.
"""

from __future__ import annotations

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
    model: torch.nn.Module, mb: MicroBatch, *, temperature: float = 1.0, with_entropy: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprob (nats, float32, with gradient) of every token of ``mb`` given the tokens before it, ``[rows, L]``.

    Column 0 (no context) is 0. Logits are divided by the sampling ``temperature`` so the logprobs are those of
    the distribution the inference engine sampled from. Also returns the per-position entropy (nats, no
    gradient) of the same distribution at the position that predicts each token, or None if not requested.
    """
    logits = model(input_ids=mb.input_ids, position_ids=mb.position_ids, use_cache=False).logits
    logits = logits[:, :-1].float()
    if temperature != 1.0:
        logits = logits / temperature
    targets = mb.input_ids[:, 1:]
    lse = torch.logsumexp(logits, dim=-1)
    lp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    lp = torch.nn.functional.pad(lp, (1, 0))
    entropy = None
    if with_entropy:
        with torch.no_grad():
            ent = lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)
            entropy = torch.nn.functional.pad(ent, (1, 0))
    return lp, entropy


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
    temperature: float = 1.0,
    info: DistInfo = DistInfo(),
    device: torch.device | str = "cpu",
    apply_update: bool = True,
) -> dict[str, float]:
    """Run one step over this rank's ``micro_batches`` and return the step's metrics (global over ranks).

    ``num_samples`` is the number of samples in the whole batch (``sample_index`` values are below it).
    ``max_norm`` clips the global gradient L2 norm (<= 0 disables clipping; the norm is still reported).
    With ``apply_update=False`` the gradients are left in the parameters (tests compare them) and neither the
    optimizer nor the scheduler steps. Metrics: loss/mean, entropy/mean, mismatch_kl/{mean,max} (per-sample
    means over RL tokens, then mean/max over samples), is_masked/mean, optim/grad_norm, optim/lr,
    perf/throughput (real tokens/s), perf/peak_memory (bytes), perf/packing_efficiency, time/step (s).
    """
    device = torch.device(device)
    t0 = time.perf_counter()
    model.train()
    mbs = [mb.to(device) for mb in micro_batches]
    f32 = dict(device=device, dtype=torch.float32)
    # Global denominators first: every micro-batch's loss is divided by the same counts.
    counts = torch.tensor(
        [sum(float(mb.loss_mask.sum()) for mb in mbs), sum(float(mb.ce_mask.sum()) for mb in mbs)], **f32
    )
    n_rl, n_ce = _all_reduce_sum(counts, info).tolist()
    loss_sum = torch.zeros((), **f32)
    entropy_sum = torch.zeros((), **f32)
    masked_sum = torch.zeros((), **f32)
    kl_per_sample = torch.zeros(num_samples + 1, **f32)  # last slot collects padding (index -1)
    tok_per_sample = torch.zeros(num_samples + 1, **f32)
    real, processed = 0, 0
    for mb in mbs:
        lp, ent = token_logprobs(model, mb, temperature=temperature)
        parts = rl_loss(
            lp, mb.inference_logprobs, mb.advantages, mb.loss_mask, mb.ce_mask, loss_cfg,
            rl_denominator=n_rl, ce_denominator=n_ce,
        )  # fmt: skip
        (parts.loss * info.world_size).backward()
        with torch.no_grad():
            lm = mb.loss_mask
            loss_sum += parts.loss.detach()
            entropy_sum += torch.where(lm, ent, torch.zeros_like(ent)).sum()
            masked_sum += parts.is_masked.sum()
            idx = torch.where(mb.sample_index >= 0, mb.sample_index, num_samples).flatten()
            kl_per_sample.index_add_(0, idx, parts.mismatch_kl.flatten())
            tok_per_sample.index_add_(0, idx, lm.flatten().float())
        real += mb.real_tokens
        processed += mb.processed_tokens
    stats = _all_reduce_sum(
        torch.cat([torch.stack([loss_sum, entropy_sum, masked_sum]), torch.tensor([real, processed], **f32)]), info
    )
    kl_per_sample = _all_reduce_sum(kl_per_sample, info)[:num_samples]
    tok_per_sample = _all_reduce_sum(tok_per_sample, info)[:num_samples]
    params = [p for p in model.parameters() if p.requires_grad]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"))
    if hasattr(grad_norm, "full_tensor"):  # DTensor under FSDP2
        grad_norm = grad_norm.full_tensor()
    lr = float(optimizer.param_groups[0]["lr"])
    if apply_update:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if scheduler is not None:
            scheduler.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - t0
    loss_v, ent_v, masked_v, real_v, processed_v = stats.tolist()
    has = tok_per_sample > 0
    kl_means = kl_per_sample[has] / tok_per_sample[has]
    return {
        "loss/mean": loss_v,
        "entropy/mean": ent_v / max(n_rl, 1.0),
        "mismatch_kl/mean": float(kl_means.mean()) if kl_means.numel() else 0.0,
        "mismatch_kl/max": float(kl_means.max()) if kl_means.numel() else 0.0,
        "is_masked/mean": masked_v / max(n_rl, 1.0),
        "optim/grad_norm": float(grad_norm),
        "optim/lr": lr,
        "perf/throughput": real_v / elapsed if elapsed > 0 else 0.0,
        "perf/peak_memory": float(_max_memory_bytes(device)),
        "perf/packing_efficiency": real_v / processed_v if processed_v else 1.0,
        "train/rl_tokens": n_rl,
        "train/real_tokens": real_v,
        "time/step": elapsed,
    }
