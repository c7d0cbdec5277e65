"""AdamW and the learning-rate schedules of the trainer (constant, linear warmup)."""

from __future__ import annotations

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


def build_scheduler(
    optimizer: torch.optim.Optimizer, *, kind: str = "constant", warmup_steps: int = 0
) -> torch.optim.lr_scheduler.LambdaLR:
    """Learning-rate multiplier per optimizer step: ``constant`` (1.0) or ``linear_warmup``.

    ``linear_warmup``: step k (0-based count of optimizer steps taken) uses ``lr * min(1, (k + 1) / warmup_steps)``,
    so the first step already moves (lr/warmup_steps) and step ``warmup_steps`` reaches the full lr.
    Raises ValueError on an unknown kind.
    """
    if kind == "constant" or (kind == "linear_warmup" and warmup_steps <= 0):
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda k: 1.0)
    if kind == "linear_warmup":
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda k: min(1.0, (k + 1) / warmup_steps))
    raise ValueError(f"unknown scheduler type {kind!r} (constant | linear_warmup)")
