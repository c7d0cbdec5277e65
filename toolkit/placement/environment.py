"""Per-process environment: layered user values, srl defaults, JIT caches on node-local scratch, GPU binding.

Layers, lowest first (a later layer wins): srl defaults < ``[env_vars]`` < component ``env_vars`` (trainer,
orchestrator, inference) < prefill/decode role vars < values srl must own (ports, run ids, rendezvous, side channel).
Owned names are rejected in user layers at validation time (:data:`OWNED_NAMES`), so a user can never silently
override them. ``CUDA_VISIBLE_DEVICES`` is owned too; it is computed on the node from the GPU set Slurm granted
(:func:`visible_devices`), never assumed to be 0..N-1.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Mapping, Sequence

# Compile/JIT caches that must live on node-local disk: Triton, torch inductor, vLLM, FlashInfer.
CACHE_VARS = {
    "TRITON_CACHE_DIR": "triton",
    "TORCHINDUCTOR_CACHE_DIR": "inductor",
    "VLLM_CACHE_ROOT": "vllm",
    "FLASHINFER_WORKSPACE_BASE": "flashinfer",
}

# Names srl sets itself; user layers may not set them.
OWNED_NAMES = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "MASTER_ADDR",
        "MASTER_PORT",
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "VLLM_NIXL_SIDE_CHANNEL_HOST",
        "VLLM_NIXL_SIDE_CHANNEL_PORT",
        "VLLM_SERVER_DEV_MODE",
    }
)
OWNED_PREFIX = "SRL_"

_VAR_RE = re.compile(r"\$\{?[A-Za-z_]")


class GpuBindingError(ValueError):
    """A process asks for GPU positions the node does not have; the message gives both numbers."""


def is_owned(name: str) -> bool:
    """True for variables only srl may set (see module docstring)."""
    return name in OWNED_NAMES or name.startswith(OWNED_PREFIX)


def srl_defaults(scratch: str, job_id: str, *, per_job: bool = True) -> dict[str, str]:
    """Lowest layer: unbuffered output and JIT/compile caches under node-local ``scratch``.

    ``per_job`` (a Slurm site): the caches live in ``<scratch>/srl-<job_id>/``, so two jobs on one node never share
    (and race on) a cache, and the node's scratch is cleaned with the job. Otherwise (the local site: one machine,
    one user's runs) they live in ``<scratch>/srl-cache-<uid>/`` and stay between runs: a warm vLLM cache skips the
    engine's model inspection at start-up (measured on the tiny model: 41 s cold, 32 s warm); vLLM and torch write
    these caches atomically, so concurrent engines may share them. :func:`private_cache_root` checks that directory
    before anything uses it. ``scratch`` may start with ``$VAR`` (e.g. ``$TMPDIR``); such values are expanded on
    the node by the process runtime (see :func:`node_expanded_keys`).
    """
    base = f"{scratch.rstrip('/')}/srl-{job_id}" if per_job else local_cache_root(scratch)
    env = {"PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.update({k: f"{base}/{sub}" for k, sub in CACHE_VARS.items()})
    return env


def local_cache_root(scratch: str) -> str:
    """The persistent per-user cache directory of local runs under ``scratch`` (see :func:`srl_defaults`)."""
    return f"{scratch.rstrip('/')}/srl-cache-{os.getuid()}"


def private_cache_root(path: str | os.PathLike[str]) -> None:
    """Create ``path`` (mode 0700) or accept it when this user owns it and nobody else may write it. Raises
    PermissionError naming the path otherwise: compiled kernels are loaded from there and executed, so a directory
    another user could write into (a predictable name in a shared /tmp) must not be used."""
    path = os.fspath(path)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise PermissionError(
            f"{path} (srl's JIT-cache directory) is not a directory that only you (uid "
            f"{os.getuid()}) may write: remove it, or set filesystem.node_local_scratch in the site "
            "config to a directory of your own"
        )


def layered(*layers: Mapping[str, str] | None) -> dict[str, str]:
    """Merge environment layers left to right (later wins); values become strings."""
    return {k: str(v) for layer in layers for k, v in (layer or {}).items()}


def node_expanded_keys(env: Mapping[str, str], defaults: Mapping[str, str]) -> tuple[str, ...]:
    """Keys whose value is still srl's default and contains a ``$VAR`` to expand on the node (scratch paths)."""
    return tuple(sorted(k for k, v in env.items() if defaults.get(k) == v and _VAR_RE.search(v)))


def visible_devices(positions: Sequence[int], inherited: str | None, gpus_per_node: int) -> str:
    """``CUDA_VISIBLE_DEVICES`` for a process given its GPU positions and the node's granted device list.

    ``inherited`` is the step's ``CUDA_VISIBLE_DEVICES`` (e.g. ``"2,5,7,9"`` on a shared node); positions index into
    it, so ``[0, 1]`` gives ``"2,5"`` and ``[2, 3]`` gives ``"7,9"``. When nothing is inherited
    (no Slurm, a plain machine) the list is ``0..gpus_per_node-1``. Empty positions give ``""`` (no GPU).
    Raises GpuBindingError when a position is beyond the visible list, naming both counts.
    """
    if not positions:
        return ""
    if inherited is not None and inherited.strip() not in ("", "NoDevFiles"):
        devices = [d.strip() for d in inherited.split(",") if d.strip()]
    else:
        devices = [str(i) for i in range(gpus_per_node)]
    need = max(positions) + 1
    if need > len(devices):
        raise GpuBindingError(
            f"process needs GPU positions {list(positions)} ({need} GPUs) but only {len(devices)} are visible "
            f"(CUDA_VISIBLE_DEVICES={inherited!r})"
        )
    return ",".join(devices[p] for p in positions)


def container_prefix(site, run_root: str) -> list[str]:
    """The argv prefix that runs a job step inside the site's container (``environment.container``: apptainer with
    the run directory and the site's binds), or [] for a site without one."""
    c = site.environment.container
    if c is None:
        return []
    argv = ["apptainer", "exec", "--nv", "--bind", str(run_root)]
    for b in c.binds:
        argv += ["--bind", b]
    return argv + [c.image]
