"""torch.distributed set-up for the trainer: one process (no process group) or torchrun ranks with FSDP2."""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

from toolkit.procutil import die_with_parent
from toolkit.trainer.step import DistInfo


def die_with_agent() -> bool:
    """Under torchrun (``TORCHELASTIC_RUN_ID`` set), ask the kernel to SIGKILL this worker when its agent dies.

    torchrun starts workers in sessions of their own, so Slurm's process-group tracking (``proctrack/pgid``) does
    not reach them: when Slurm kills the agent after ``KillWait``, a worker still checkpointing would live on as an
    orphan and write into the run directory next to the requeued job's trainer. ``procutil.die_with_parent`` closes
    that gap. Returns whether it was set (Linux under torchrun only); exits at once if the agent is already gone.
    """
    return "TORCHELASTIC_RUN_ID" in os.environ and die_with_parent()


def init_distributed(timeout_s: float = 1800.0) -> tuple[DistInfo, torch.device]:
    """Read torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK) and start the process group if WORLD_SIZE > 1.

    Backend: NCCL when CUDA is available, gloo otherwise. Returns the rank layout and this rank's device
    (``cuda:<local_rank>`` or ``cpu``). With WORLD_SIZE unset or 1 nothing is initialised.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=timeout_s))
    return DistInfo(rank=rank, world_size=world, local_rank=local), device


def shard_model(model: torch.nn.Module, info: DistInfo) -> torch.nn.Module:
    """Apply FSDP2 ``fully_shard`` to each decoder layer and then the whole model (no-op for one rank).

    Per-layer sharding lets FSDP free a layer's gathered weights before the next layer runs. The model is
    returned in place (fully_shard mutates the module's class).
    """
    if info.world_size == 1:
        return model
    from torch.distributed.fsdp import fully_shard

    for layer in decoder_layers(model):
        fully_shard(layer)
    fully_shard(model)
    return model


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder layers of a HF causal LM (``model.model.layers``), also inside a peft LoRA wrapper (whose
    ``base_model.model`` is the causal LM); ``[]`` when the model has no such list."""
    if hasattr(model, "get_base_model"):  # peft: PeftModel -> LoraModel -> the causal LM
        model = model.get_base_model()
    layers = getattr(getattr(model, "model", model), "layers", None)
    return list(layers) if layers is not None else []


def barrier(info: DistInfo) -> None:
    """Wait for every rank (no-op for one rank)."""
    if info.world_size > 1:
        dist.barrier()


def broadcast_flag(flag: bool, info: DistInfo) -> bool:
    """True on every rank if ``flag`` is true on any rank (so all ranks stop at the same step)."""
    if info.world_size == 1:
        return flag
    t = torch.tensor([1.0 if flag else 0.0])
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


def shutdown(info: DistInfo) -> None:
    """Leave the process group, all ranks together. Every caller is a point all ranks reach (the run's end, a
    divergence decided on all-reduced metrics). Without the barrier a rank that returned early (a non-main rank
    after a gather whose result only rank 0 keeps) tore its group down while its peer was still in the transfer,
    and the process ended in ``terminate called without an active exception`` (SIGABRT; seen on a loaded 2-core
    host in a 2-rank LoRA export)."""
    if info.world_size > 1 and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
