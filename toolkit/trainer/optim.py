"""AdamW and the learning-rate schedules of the trainer (constant, linear warm-up, linear and cosine decay)."""

from __future__ import annotations

import math

import torch


def build_optimizer(
    model: torch.nn.Module, *, lr: float, weight_decay: float, betas: tuple[float, float]
) -> torch.optim.AdamW:
    """AdamW (Loshchilov & Hutter, 2019) over the trainable parameters.

    Weight decay applies to matrices only (ndim >= 2); biases and norm gains are not decayed, the usual choice
    for transformers (decaying a norm gain towards 0 shrinks activations rather than regularising).
    """
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    groups = [g for g in groups if g["params"]]
    return torch.optim.AdamW(groups, lr=lr, betas=tuple(betas))


def lr_multiplier(
    k: int, *, kind: str, warmup_steps: int = 0, total_steps: int | None = None, min_lr_ratio: float = 0.0
) -> float:
    """Learning-rate multiplier of optimizer step ``k`` (0-based count of steps already taken).

    - ``constant``: 1.
    - ``linear_warmup``: ``min(1, (k + 1) / warmup_steps)``: the first step already moves (lr / warmup_steps) and
      step ``warmup_steps`` reaches the full lr.
    - ``linear`` / ``cosine``: the same warm-up, then a decay from 1 at step ``warmup_steps`` to ``min_lr_ratio``
      at step ``total_steps``: linearly, or along half a cosine ``m + (1 - m) * (1 + cos(pi * p)) / 2`` with
      ``p`` the fraction of the decay done (the cosine schedule of Loshchilov & Hutter, "SGDR", 2017, without
      restarts).

    Raises ValueError on an unknown kind, or a decaying kind without ``total_steps``.
    """
    warm = min(1.0, (k + 1) / warmup_steps) if warmup_steps > 0 else 1.0
    if kind in ("constant",):
        return 1.0
    if kind == "linear_warmup":
        return warm
    if kind not in ("linear", "cosine"):
        raise ValueError(f"unknown scheduler type {kind!r} (constant | linear_warmup | linear | cosine)")
    if total_steps is None:
        raise ValueError(f"scheduler {kind!r} needs total_steps (the run's max_steps)")
    if k < warmup_steps:
        return warm
    span = max(1, total_steps - warmup_steps)
    p = min(1.0, (k + 1 - warmup_steps) / span)
    decay = 1.0 - p if kind == "linear" else (1.0 + math.cos(math.pi * p)) / 2.0
    return min_lr_ratio + (1.0 - min_lr_ratio) * decay


def build_scheduler(
    optimizer: torch.optim.Optimizer,
    *,
    kind: str = "constant",
    warmup_steps: int = 0,
    total_steps: int | None = None,
    min_lr_ratio: float = 0.0,
) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` whose multiplier per optimizer step is :func:`lr_multiplier` (same arguments).

    Raises ValueError as :func:`lr_multiplier` does, before any step is taken.
    """
    lr_multiplier(0, kind=kind, warmup_steps=warmup_steps, total_steps=total_steps, min_lr_ratio=min_lr_ratio)
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda k: lr_multiplier(
            k, kind=kind, warmup_steps=warmup_steps, total_steps=total_steps, min_lr_ratio=min_lr_ratio
        ),
    )
