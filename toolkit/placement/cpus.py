"""CPU threads per process on CPU-only plans: which cores a vLLM engine binds, how many torch threads a trainer rank
uses.

Why: on a machine without GPUs, vLLM's CPU engine spins OpenMP threads on the cores it binds and torch's intra-op
pool starts one thread per visible core in every trainer rank. Left alone they oversubscribe the cores; measured on
2 cores, a trainer step with 2 torch threads next to a busy engine ran 5-10x slower than with 1. The local launcher
uses this same function.

Which processes share cores is decided by node address: processes placed on nodes with the same routable address
run on the same machine (the local Slurm test cluster runs four emulated nodes on 127.0.0.1 with the same two real
cores), so the split is computed over every process of the host, not only over the Slurm node. On a real cluster
each node has its own address and the split is per node.

Split of ``n_cores`` cores on one host with ``E`` engines and ``R`` trainer ranks :
each engine gets ``per = max(1, (n_cores - 1) // E)`` cores (``1`` when ``n_cores <= E``; ``n_cores // E`` when
neither a trainer rank nor the orchestrator runs on the host, as in an inference-only deployment), bound with
``VLLM_CPU_OMP_THREADS_BIND``; the trainer ranks share the rest, ``max(1, (n_cores - per * E) // R)`` threads each
(``OMP_NUM_THREADS``). Values a user set in the config's env tables are kept.

Core numbers are positions in the CPUs this process may use (``cpu_ids``, e.g. a Slurm allocation's cores 8-15),
mapped to those CPUs' ids. An engine's whole process tree is also pinned to its cores (``SRL_CPU_AFFINITY``,
applied by the launcher with :func:`apply_affinity` just before the engine starts): an engine with worker processes
(tp x dp > 1) has its engine core and workers poll each other's shared-memory queues in a ``sched_yield`` loop for up
to a second after each message, so under load they spin without pause on whatever cores they run on; pinned, they
spin only against each other and the engine's own API server (a one-worker CPU engine runs its model in the engine
core: toolkit.engines.commands.engine_env). Measured with ``tests/benchmarks/rl_loop.py`` on 2 cores in interleaved
runs, before one-worker engines ran in one process: the mean step went from 0.67-0.69 s unpinned to 0.47-0.55 s
pinned (the trainer's own step from 0.24-0.28 s to 0.18-0.21 s), and pinning only the engine core and its worker,
leaving the API server free, was slower than pinning all three (mean 0.42-0.57 s against 0.32-0.36 s in the same
session).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from toolkit.config.site import SiteConfig
    from toolkit.placement.plan import Plan


# Options of slurm.extra_directives (long options only: the config rules refuse others) by which a user sizes the
# job's CPUs themselves. --exclusive alone takes whole nodes; --exclusive=user or =mcs only keeps others away.
_USER_CPU_OPTION = re.compile(r"--((cpus-per-task|cpus-per-gpu|mincpus)=|exclusive$|tres-per-task=(.*,)?cpu[:=])")


def cpu_request(site: SiteConfig, gpus_per_node: int, extra_directives: Sequence[str] = ()) -> int | None:
    """Cores a Slurm node group with ``gpus_per_node`` GPUs per node asks per node: the site's ``[cpus]``
    (``per_gpu`` x GPUs, or ``without_gpus``); None when the site sets none or when ``extra_directives`` (the run's
    ``slurm.extra_directives``, for the job's first group) already size the CPUs (``--cpus-per-task``,
    ``--cpus-per-gpu``, ``--mincpus``, a CPU in ``--tres-per-task``, ``--exclusive`` without a value)."""
    if any(_USER_CPU_OPTION.match(d) for d in extra_directives):
        return None
    return site.cpus.per_node(gpus_per_node)


OMP_BIND = "VLLM_CPU_OMP_THREADS_BIND"
OMP_THREADS = "OMP_NUM_THREADS"
AFFINITY = "SRL_CPU_AFFINITY"


def _host_nodes(plan: Plan, node: int) -> set[int]:
    """Node indices on the same machine as ``node`` (same address; just ``node`` when addresses are unknown)."""
    addrs = plan.addresses
    if node >= len(addrs):
        return {node}
    return {i for i, a in enumerate(addrs) if a == addrs[node]}


def cpu_thread_env(plan: Plan, name: str, node: int, cpu_ids: Sequence[int] | None = None) -> dict[str, str]:
    """Extra environment for process ``name`` running on node index ``node`` of a CPU-only ``plan``.

    ``cpu_ids``: the CPUs this process may use on its machine, ascending (default: this process's affinity);
    ``n_cores`` above is their number.
    Returns ``{}`` for GPU plans, for roles that need no setting (orchestrator, router) and for variables the
    process's env already sets. An engine gets ``VLLM_CPU_OMP_THREADS_BIND`` and ``SRL_CPU_AFFINITY`` (the same
    CPUs, for :func:`apply_affinity`) unless its env sets the bind, and ``OMP_NUM_THREADS`` = their number. Engines
    on the host are ordered by plan position, so every process of the host computes the same split without talking
    to the others.
    """
    ids = sorted(os.sched_getaffinity(0)) if cpu_ids is None else list(cpu_ids)
    n_cores = len(ids)
    if plan.gpus_per_node or n_cores < 1:
        return {}
    spec = plan.process(name)
    host = _host_nodes(plan, node)
    # A served teacher is an engine like the policy's: it gets cores of its own.
    engines = [p.name for p in plan.processes if p.role in ("inference", "teacher") and host & set(p.node_indices)]
    ranks = sum(p.nprocs_per_node * len(host & set(p.node_indices)) for p in plan.processes if p.role == "trainer")
    # One core is kept for the trainer ranks and the orchestrator when the host runs any of them; an inference-only
    # plan (srl inference, the eval gate's server) gives its engines every core.
    orchestrator = any(p.role == "orchestrator" and host & set(p.node_indices) for p in plan.processes)
    reserve = 1 if ranks or orchestrator else 0
    per = max(1, (n_cores - reserve) // len(engines)) if engines and n_cores > len(engines) - 1 + reserve else 1
    if name in engines and OMP_BIND not in spec.env:
        lo = (engines.index(name) * per) % n_cores
        hi = min(n_cores - 1, lo + per - 1)
        text = format_cpu_list(ids[lo : hi + 1])
        out = {k: text for k in (OMP_BIND, AFFINITY) if k not in spec.env}
        # A single-process engine runs its model in the engine core, where vLLM sets no thread count of its own.
        if OMP_THREADS not in spec.env:
            out[OMP_THREADS] = str(hi - lo + 1)
        return out
    if spec.role == "trainer" and OMP_THREADS not in spec.env:
        left = max(1, n_cores - per * len(engines))
        return {OMP_THREADS: str(max(1, left // max(1, ranks)))}
    return {}


def format_cpu_list(cpus: list[int]) -> str:
    """``[0]`` -> ``"0"``, ``[0, 1, 2]`` -> ``"0-2"``, ``[8, 10]`` -> ``"8,10"`` (ascending ids)."""
    if cpus == list(range(cpus[0], cpus[-1] + 1)):
        return str(cpus[0]) if len(cpus) == 1 else f"{cpus[0]}-{cpus[-1]}"
    return ",".join(str(c) for c in cpus)


def parse_cpu_list(text: str) -> set[int]:
    """CPU ids of a list like ``"0"``, ``"0-3"`` or ``"0,2,4-7"`` (the format of ``VLLM_CPU_OMP_THREADS_BIND`` and
    ``taskset -c``). Raises ValueError naming ``SRL_CPU_AFFINITY`` and the text when it is not one."""
    cpus: set[int] = set()
    try:
        for part in text.split(","):
            lo, _, hi = part.strip().partition("-")
            a, b = int(lo), int(hi or lo)
            if a < 0 or b < a:
                raise ValueError
            cpus.update(range(a, b + 1))
    except ValueError:
        raise ValueError(f"{AFFINITY}={text!r}: expected CPU ids like 0, 0-3 or 0,2,4-7") from None
    return cpus


def affinity_of(env: dict[str, str]) -> set[int] | None:
    """The CPUs a process started with ``env`` is to be pinned to (``SRL_CPU_AFFINITY``), or None (no pinning).
    Raises ValueError on a malformed value."""
    text = env.get(AFFINITY, "").strip()
    return parse_cpu_list(text) if text else None


def apply_affinity(cpus: set[int] | None) -> None:
    """Pin the calling process (and so everything it starts afterwards) to ``cpus``; None does nothing. CPUs this
    process may not use are dropped; when none is left the affinity stays as it is (a changed machine must not stop
    a run). Plain system call: safe in a ``preexec_fn`` between fork and exec."""
    if not cpus:
        return
    allowed = os.sched_getaffinity(0) & cpus
    if allowed:
        os.sched_setaffinity(0, allowed)
