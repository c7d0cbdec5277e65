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
"""

from __future__ import annotations

from typing import Any

OMP_BIND = "VLLM_CPU_OMP_THREADS_BIND"
OMP_THREADS = "OMP_NUM_THREADS"


def _host_nodes(plan: Any, node: int) -> set[int]:
    """Node indices on the same machine as ``node`` (same address; just ``node`` when addresses are unknown)."""
    addrs = plan.addresses
    if node >= len(addrs):
        return {node}
    return {i for i, a in enumerate(addrs) if a == addrs[node]}


def cpu_thread_env(plan: Any, name: str, node: int, n_cores: int) -> dict[str, str]:
    """Extra environment for process ``name`` running on node index ``node`` of a CPU-only ``plan``.

    ``n_cores``: cores this process may use on its machine (e.g. ``len(os.sched_getaffinity(0))``), >= 1.
    Returns ``{}`` for GPU plans, for roles that need no setting (orchestrator, router) and for variables the
    process's env already sets. Engines on the host are ordered by plan position, so every process of the host
    computes the same split without talking to the others.
    """
    if plan.gpus_per_node or n_cores < 1:
        return {}
    spec = plan.process(name)
    host = _host_nodes(plan, node)
    engines = [p.name for p in plan.processes if p.role == "inference" and host & set(p.node_indices)]
    ranks = sum(p.nprocs_per_node * len(host & set(p.node_indices)) for p in plan.processes if p.role == "trainer")
    # One core is kept for the trainer ranks and the orchestrator when the host runs any of them; an inference-only
    # plan (srl inference, the eval gate's server) gives its engines every core.
    orchestrator = any(p.role == "orchestrator" and host & set(p.node_indices) for p in plan.processes)
    reserve = 1 if ranks or orchestrator else 0
    per = max(1, (n_cores - reserve) // len(engines)) if engines and n_cores > len(engines) - 1 + reserve else 1
    if spec.role == "inference" and name in engines and OMP_BIND not in spec.env:
        lo = (engines.index(name) * per) % n_cores
        hi = min(n_cores - 1, lo + per - 1)
        return {OMP_BIND: str(lo) if lo == hi else f"{lo}-{hi}"}
    if spec.role == "trainer" and OMP_THREADS not in spec.env:
        left = max(1, n_cores - per * len(engines))
        return {OMP_THREADS: str(max(1, left // max(1, ranks)))}
    return {}
