"""The trainer's part of a checkpoint: ``<run>/checkpoints/step_<n>/trainer/``.

One process: ``model.safetensors`` (weights), ``optimizer.pt``, ``trainer_state.pt`` (step, scheduler, RNG).
Several ranks (FSDP2): ``dcp/`` written by every rank with ``torch.distributed.checkpoint`` (each rank writes
its shards), ``trainer_state.pt`` from rank 0 and ``rng_rank<r>.pt`` per rank. Either way the part is written in
a temporary directory that rank 0 renames into place, then ``toolkit.checkpoints.mark_complete_if_ready`` writes
the step's COMPLETE marker if the orchestrator's part is there too.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from safetensors.torch import load_file

from toolkit import checkpoints, fsutil
from toolkit.run.layout import RunDir
from toolkit.trainer.broadcast import ST_DTYPE_TAGS, save_safetensors
from toolkit.trainer.step import DistInfo

PART = "trainer"
_ONE_PROCESS = DistInfo()  # the default layout: one process, no torch.distributed calls


def _rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _torch_save(obj, path: Path) -> None:
    torch.save(obj, path)
    with open(path, "rb") as f:
        os.fsync(f.fileno())


# safetensors dtype tag -> torch dtype of the tensors read in place (the writer's table, inverted).
_ST_DTYPES = {tag: dtype for dtype, tag in ST_DTYPE_TAGS.items()}


# Concurrent read streams per file and the file size from which they are used. Why: one sequential stream keeps
# one request in flight (plus readahead); two keep the device (a virtio disk here, the object storage targets of a
# parallel filesystem on a cluster) busier: a 1 GB read took 0.42-0.57 s with two streams against 0.40-0.99 s with
# one on this machine (drop_cache'd, interleaved). Small files are not worth a thread.
READ_STREAMS = 2
PARALLEL_READ_BYTES = 64 << 20


def _contiguous_spans(jobs: list, n: int) -> list[list]:
    """Split file-ordered ``(offset, name, view)`` jobs into at most ``n`` runs of about equal bytes, each still
    in file order (each run is one sequential stream)."""
    total = sum(len(view) for _, _, view in jobs)
    spans: list[list] = [[]]
    filled = 0
    for job in jobs:
        if filled >= total * len(spans) / n and len(spans) < n:
            spans.append([])
        spans[-1].append(job)
        filled += len(job[2])
    return spans


def _pread_all(fd: int, path: Path, jobs: list) -> None:
    """Fill each ``(offset, name, view)`` from file descriptor ``fd`` at ``offset``; ValueError on a short file."""
    for offset, name, view in jobs:
        done = 0
        while done < len(view):
            got = os.preadv(fd, [view[done:]], offset + done)
            if not got:
                raise ValueError(f"{path}: file ends inside tensor {name}")
            done += got


# The largest header the reference reader accepts (safetensors' MAX_HEADER_SIZE, 100 MB): a corrupt length field
# must not make the reader allocate gigabytes before it finds out.
_MAX_HEADER_BYTES = 100_000_000


def _read_header(f, path: Path) -> tuple[int, dict[str, tuple[str, list[int], int, int]]]:
    """Parse and check the header of safetensors file ``f`` (opened unbuffered at offset 0).

    Returns ``(data_start, {name: (dtype tag, shape, begin, end)})``, offsets in bytes from ``data_start``. Checked
    as the reference reader checks it (github.com/huggingface/safetensors, ``Metadata::validate``): a JSON object of
    ``{dtype, shape, data_offsets}`` entries whose data ranges tile the data section from 0 to the end of the file,
    in order, without gaps or overlaps. Why: an offset past the end, before the start or into another tensor would
    otherwise be read silently as that tensor's values; a truncated file is caught before any byte is read.
    Raises ValueError (message ``... ends inside tensor <name>`` for a truncated file).
    """
    size = os.fstat(f.fileno()).st_size
    n = int.from_bytes(f.read(8), "little")
    if size < 8 or n > min(size - 8, _MAX_HEADER_BYTES):
        raise ValueError(f"{path}: not a safetensors file (header length {n}, file size {size} bytes)")
    try:
        header = json.loads(f.read(n))
    except (UnicodeDecodeError, RecursionError) as e:  # JSONDecodeError is a ValueError already
        raise ValueError(f"{path}: header is not JSON: {type(e).__name__}") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: header is not a JSON object")  # noqa: TRY004 - a malformed file, as elsewhere
    header.pop("__metadata__", None)
    data_start, data_len = 8 + n, size - 8 - n
    out: dict[str, tuple[str, list[int], int, int]] = {}
    for name, spec in header.items():
        offs = spec.get("data_offsets") if isinstance(spec, dict) else None
        shape = spec.get("shape") if isinstance(spec, dict) else None
        if not (
            isinstance(offs, list)
            and len(offs) == 2
            and all(type(o) is int for o in offs)
            and 0 <= offs[0] <= offs[1]
            and isinstance(shape, list)
            and all(type(d) is int and d >= 0 for d in shape)
            and isinstance(spec.get("dtype"), str)
        ):
            raise ValueError(f"{path}: malformed header entry for tensor {name}: {str(spec)[:200]}")
        out[name] = (spec["dtype"], shape, offs[0], offs[1])
    expect = 0
    for name, (_, _, begin, end) in sorted(out.items(), key=lambda kv: (kv[1][2], kv[1][3])):
        if begin != expect:
            raise ValueError(
                f"{path}: tensor {name} starts at byte {begin} of the data, expected {expect} (the "
                "header's data ranges overlap or leave a gap)"
            )
        if end > data_len:
            raise ValueError(
                f"{path}: file ends inside tensor {name} (data ends at byte {data_len}, the tensor at {end}): truncated"
            )
        expect = end
    if expect != data_len:
        raise ValueError(f"{path}: {data_len - expect} bytes after the last tensor the header names")
    return data_start, out


def _reusable(t: torch.Tensor | None, shape, dtype: torch.dtype | None) -> bool:
    """Whether bytes of a tensor of ``shape``/``dtype`` can be read straight into ``t``'s memory."""
    return (
        t is not None
        and t.dtype == dtype
        and tuple(t.shape) == tuple(shape)
        and t.device.type == "cpu"
        and t.is_contiguous()
    )


def _read_safetensors_into(path: Path, state: dict[str, torch.Tensor]) -> bool:
    """Read safetensors file ``path`` straight into the matching tensors of ``state`` (a model's state dict, whose
    tensors share memory with its parameters and buffers); returns False, having changed nothing, unless the file
    holds exactly those names with the same dtypes and shapes and every target is a contiguous CPU tensor.

    Why: ``load_file`` maps the file and ``load_state_dict`` then copies it, faulting it in page by page: about 4x
    the wall time of one sequential read on a cold cache (tests/benchmarks/checkpoint_io.py). Here each tensor is
    read straight into its memory (``preadv``) in file order, by ``READ_STREAMS`` concurrent streams for a large
    file, with no intermediate copy. Format: 8-byte little-endian header length, JSON
    header ``{name: {dtype, shape, data_offsets: [begin, end]}}``, then the data (offsets relative to its start).
    Raises OSError, or ValueError on a malformed or truncated file (found from the header and the file size before
    anything is written into ``state``; a file that shrinks during the read raises too, part-way).
    """
    with open(path, "rb", buffering=0) as f:
        if hasattr(os, "posix_fadvise"):  # one front-to-back pass: a larger kernel readahead window
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        base, header = _read_header(f, path)
        if set(header) != set(state):
            return False
        plan = []
        for name, (dtype, shape, begin, end) in header.items():
            t = state[name]
            if not _reusable(t, shape, _ST_DTYPES.get(dtype)) or end - begin != t.numel() * t.element_size():
                return False
            plan.append((begin, name))
        jobs = [
            (base + begin, name, memoryview(state[name].detach().reshape(-1).view(torch.uint8).numpy()))
            for begin, name in sorted(plan)
            if state[name].numel()
        ]
        total = sum(len(view) for _, _, view in jobs)
        spans = _contiguous_spans(jobs, READ_STREAMS if total >= PARALLEL_READ_BYTES else 1)
        if len(spans) == 1:
            _pread_all(f.fileno(), path, spans[0])
        else:
            with ThreadPoolExecutor(len(spans)) as pool:  # preadv releases the GIL: the streams overlap
                for done in [pool.submit(_pread_all, f.fileno(), path, span) for span in spans]:
                    done.result()
    return True


_TENSOR_REF = "__safetensors__"  # placeholder key in optimizer.pt for a tensor stored in optimizer.safetensors


def _split_optimizer_state(sd: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Optimizer ``state_dict()`` -> (its tensors by name ``state.<param>.<key>``, the rest with each tensor
    replaced by ``{_TENSOR_REF: name, "dtype": ..., "shape": ...}``). Adam's moments are 2/3 of a checkpoint: as
    safetensors they are read in place (:func:`_read_safetensors_into`) instead of unpickled and copied."""
    tensors: dict[str, torch.Tensor] = {}
    state: dict[Any, dict[str, Any]] = {}
    for pid, entries in sd["state"].items():
        state[pid] = {}
        for key, value in entries.items():
            if isinstance(value, torch.Tensor):
                name = f"state.{pid}.{key}"
                tensors[name] = value.detach().cpu().contiguous()
                value = {_TENSOR_REF: name, "dtype": value.dtype, "shape": tuple(value.shape)}
            state[pid][key] = value
    return tensors, {"state": state, "param_groups": sd["param_groups"]}


# Optimizer state entries that are shaped like their parameter by definition (torch.optim Adam/AdamW/SGD allocate
# them with ``zeros_like(param)``): a saved one of another shape belongs to another parameter or another model.
_PARAM_SHAPED = frozenset({"exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer"})


def _check_layout(sd: dict[str, Any], params: list[list[torch.Tensor]], where: Path) -> None:
    """Raise ValueError unless saved optimizer state ``sd`` (tensors possibly as ``_TENSOR_REF`` placeholders) fits
    ``params`` (the optimizer's parameters, group by group): as many groups, as many parameters in each, and every
    parameter-shaped entry with its parameter's shape. Checked before anything is read into the optimizer's own
    tensors, so a mismatched checkpoint leaves them as they were."""
    saved = [g["params"] for g in sd["param_groups"]]
    if [len(g) for g in saved] != [len(g) for g in params]:
        raise ValueError(
            f"{where}: the checkpoint's optimizer has parameter groups of sizes "
            f"{[len(g) for g in saved]}, this optimizer {[len(g) for g in params]}"
        )
    by_id = {pid: p for ids, ps in zip(saved, params) for pid, p in zip(ids, ps)}
    for pid, entries in sd["state"].items():
        p = by_id.get(pid)
        if p is None:
            raise ValueError(f"{where}: optimizer state for parameter {pid}, which no parameter group lists")
        for key, v in entries.items():
            shape = (
                tuple(v["shape"])
                if isinstance(v, dict) and _TENSOR_REF in v
                else (tuple(v.shape) if isinstance(v, torch.Tensor) else None)
            )
            if key in _PARAM_SHAPED and shape is not None and shape != tuple(p.shape):
                raise ValueError(
                    f"{where}: optimizer state {key} of parameter {pid} has shape {list(shape)}, the "
                    f"parameter {list(p.shape)}: the checkpoint is of another model"
                )


def _load_optimizer_state(
    part: Path, current: dict[str, torch.Tensor] | None = None, *, params: list[list[torch.Tensor]] | None = None
) -> dict[str, Any]:
    """The optimizer ``state_dict`` saved in ``part``: ``optimizer.pt`` plus, in the current layout, the tensors
    of ``optimizer.safetensors`` read straight into tensors (no second copy: AdamW's ``load_state_dict`` keeps a
    tensor that already has the parameter's dtype and device). ``current`` (names as in
    :func:`_split_optimizer_state`) are the optimizer's own state tensors: one with the saved dtype and shape is
    overwritten in place, the rest are allocated. Why: a fresh allocation of Adam's moments costs a page fault per
    4 KiB page, about as long as reading the bytes (tests/benchmarks/checkpoint_io.py), and holding old and new state
    at once doubles the peak memory. Older checkpoints hold everything in ``optimizer.pt``. Raises
    FileNotFoundError, or ValueError for a file that does not match: ``params`` (the optimizer's parameters, group
    by group) when given, or the safetensors file's own header (checked before any byte is read in place; only a
    file that shrinks during the read can leave the tensors holding part of it: the caller stops, as for a failed
    weight load)."""
    sd = torch.load(part / "optimizer.pt", weights_only=False)
    if params is not None:
        _check_layout(sd, params, part / "optimizer.pt")
    st_path = part / "optimizer.safetensors"
    if not st_path.exists():
        return sd
    current = current or {}
    refs = [
        (entries, key, v)
        for entries in sd["state"].values()
        for key, v in entries.items()
        if isinstance(v, dict) and _TENSOR_REF in v
    ]
    fresh = {}
    for _, _, v in refs:
        name, shape, dtype = v[_TENSOR_REF], v["shape"], v["dtype"]
        own = current.get(name)
        fresh[name] = own if _reusable(own, shape, dtype) else torch.empty(shape, dtype=dtype)
    if not _read_safetensors_into(st_path, fresh):
        raise ValueError(f"{st_path} does not hold the tensors {part / 'optimizer.pt'} names")
    for entries, key, v in refs:
        entries[key] = fresh[v[_TENSOR_REF]]
    return sd


def _load_weights(path: Path, model: torch.nn.Module) -> None:
    """Load ``model.safetensors`` into ``model``: in place when the layout matches, else ``load_state_dict``
    (strict: raises RuntimeError naming missing or unexpected keys)."""
    with torch.no_grad():
        if not _read_safetensors_into(path, model.state_dict()):
            model.load_state_dict(load_file(str(path)))


# fp32 weights (4 bytes) + Adam's two fp32 moment estimates (2 x 4 bytes) per parameter (Kingma & Ba 2015, Alg. 1).
BYTES_PER_PARAM = 12


class CheckpointSpaceError(OSError):
    """A checkpoint save hit a full filesystem or quota. The message gives the checkpoint size, the space a run
    needs with its retention, and the complete checkpoint that survived."""


def checkpoint_bytes(num_params: int) -> int:
    """Approximate size in bytes of one trainer checkpoint of a model with ``num_params`` parameters (fp32 + Adam)."""
    return BYTES_PER_PARAM * num_params


def _out_of_space(exc: BaseException, directory: Path, need: int) -> bool:
    # safetensors and torch.save do not raise OSError(ENOSPC): safetensors says "No space left on device (os error
    # 28)" in a SafetensorError, torch.save only "unexpected pos ...". So the free space decides as well.
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(exc)
    if any(s in text for s in ("No space left", "Disk quota exceeded", "os error 28", "os error 122")):
        return True
    try:
        return shutil.disk_usage(directory).free < need
    except OSError:
        return False


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000:
            return f"{n:.3g} {unit}"
        n /= 1000
    return f"{n:.3g} TB"


def _space_message(run: RunDir, step: int, num_params: int, keep_last: int | None, exc: BaseException) -> str:
    one = checkpoint_bytes(num_params)
    kept = (keep_last or 1) + 1  # retention deletes the oldest only after the new checkpoint is COMPLETE
    try:
        free = f"{_size(shutil.disk_usage(run.checkpoints).free)} free now"
    except OSError:
        free = "free space unknown"
    prev = checkpoints.latest_complete(run)
    return (
        f"checkpoint step {step} does not fit in {run.checkpoints} ({free}): {exc}. A checkpoint takes about "
        f"{BYTES_PER_PARAM} bytes per parameter x {num_params:,} parameters = {_size(one)}, and a run keeps "
        f"keep_last + 1 = {kept} of them while saving: about {_size(kept * one)} (plus weight broadcasts). "
        + (
            f"The complete checkpoint step {prev} is untouched. "
            if prev is not None
            else "No complete checkpoint exists yet. "
        )
        + "Free space or lower ckpt.keep_last, then continue with --resume. The trainer stops here: retrying "
        "would hit the same wall."
    )


def save_trainer_state(
    run: RunDir,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    *,
    info: DistInfo = _ONE_PROCESS,
    keep_last: int | None = None,
) -> Path:
    """Write the trainer part of checkpoint ``step`` (every rank calls this); returns its final path.

    The part appears under its final name only when complete (temporary directory + rename by rank 0). The step's
    COMPLETE marker is written by :func:`toolkit.checkpoints.mark_complete_if_ready` (rank 0 calls it after this).
    Raises CheckpointSpaceError when the filesystem or quota is full (``keep_last``, the run's retention, sizes
    the advice in its message), other errors of the writers as they come; the temporary directory is removed.
    """
    try:
        return _save_trainer_state(run, step, model, optimizer, scheduler, info=info)
    except Exception as e:
        n = sum(p.numel() for p in model.parameters())
        if _out_of_space(e, run.checkpoints, checkpoint_bytes(n)):
            raise CheckpointSpaceError(errno.ENOSPC, _space_message(run, step, n, keep_last, e)) from e
        raise


def _save_trainer_state(run, step, model, optimizer, scheduler, *, info: DistInfo) -> Path:
    final = checkpoints.part_dir(run, step, PART)
    meta = {"step": step, "scheduler": scheduler.state_dict() if scheduler is not None else None}
    if info.world_size == 1:
        with fsutil.atomic_directory(final) as tmp:
            save_safetensors(
                tmp / "model.safetensors", {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
            )
            tensors, rest = _split_optimizer_state(optimizer.state_dict())
            save_safetensors(tmp / "optimizer.safetensors", tensors)
            _torch_save(rest, tmp / "optimizer.pt")
            _torch_save({**meta, "rng": _rng_state()}, tmp / "trainer_state.pt")
        return final
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    with contextlib.ExitStack() as main_rank_dir:  # the main rank's atomic_directory; renamed once all ranks wrote
        tmp_box = [str(main_rank_dir.enter_context(fsutil.atomic_directory(final))) if info.is_main else None]
        dist.broadcast_object_list(tmp_box, src=0)  # one rank creates directories; the others only write files
        tmp = Path(tmp_box[0])
        model_sd, optim_sd = get_state_dict(model, optimizer)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp / "dcp"))
        _torch_save(_rng_state(), tmp / f"rng_rank{info.rank}.pt")
        if info.is_main:
            _torch_save(meta, tmp / "trainer_state.pt")
        dist.barrier()
    dist.barrier()
    return final


def load_trainer_state(
    part: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    *,
    info: DistInfo = _ONE_PROCESS,
) -> int:
    """Restore model, optimizer, scheduler and RNG from a trainer part directory; returns its step.

    ``model``/``optimizer`` must be built as for training (same wrapping and parameter groups). Raises
    FileNotFoundError if the part lacks a file of its layout.
    """
    part = Path(part)
    meta = torch.load(part / "trainer_state.pt", weights_only=False)
    if info.world_size == 1:
        _load_weights(part / "model.safetensors", model)
        own_state, _ = _split_optimizer_state(optimizer.state_dict())  # the live tensors, not copies
        groups = [list(g["params"]) for g in optimizer.param_groups]
        optimizer.load_state_dict(_load_optimizer_state(part, own_state, params=groups))
        _set_rng_state(meta["rng"])
    else:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=str(part / "dcp"))
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        _set_rng_state(torch.load(part / f"rng_rank{info.rank}.pt", weights_only=False))
    if scheduler is not None and meta.get("scheduler") is not None:
        scheduler.load_state_dict(meta["scheduler"])
    return int(meta["step"])
