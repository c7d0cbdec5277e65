"""Performance figures of the trainer: parameter count and model FLOPs utilisation (MFU)."""

from __future__ import annotations

import torch

# Dense bf16 peak FLOP/s per GPU from the vendors' data sheets (no sparsity).
_PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12, "B200": 2250e12}


def num_parameters(model: torch.nn.Module) -> int:
    """Number of parameters (all, trainable or not), counted before sharding."""
    return sum(p.numel() for p in model.parameters())


def peak_flops(device: torch.device) -> float | None:
    """Peak dense bf16 FLOP/s of ``device`` from a small table of GPU names, or None if unknown / CPU."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((flops for key, flops in _PEAK_BF16.items() if key in name), None)


def mfu(tokens_per_s: float, n_params: int, device: torch.device, world_size: int = 1) -> float | None:
    """Model FLOPs utilisation: ``6 * n_params * tokens_per_s / (world_size * peak)``.

    6 FLOPs per parameter per token for forward + backward (Kaplan et al. 2020, "Scaling Laws", sec. 2.1;
    attention FLOPs left out). ``tokens_per_s`` is the global throughput. None where the peak is unknown.
    """
    peak = peak_flops(device)
    if not peak:
        return None
    return 6.0 * n_params * tokens_per_s / (world_size * peak)
