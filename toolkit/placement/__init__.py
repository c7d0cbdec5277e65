"""Placement: which process runs on which node and GPUs, with which ports, command and environment.

Public API: :func:`build_plan`, :func:`write_plan`, :func:`read_plan`, :func:`fill`, :class:`Plan`,
:func:`visible_devices`. Login-node safe (no torch, no vLLM).

Modules:
  topology     node arithmetic of a deployment, derived once
  plan         the plan: every process with its node, GPUs, ports, command and environment (JSON round trip)
  ports        a port block per run, distinct offsets per host
  environment  per-process environment layers, JIT caches on node-local scratch, GPU binding
  cpus         CPU threads and cores per process on CPU-only plans
  cost         the cost envelope of a Slurm job: nodes and GPUs per het group, node- and GPU-hours per attempt
  runtime      node-side helpers of the batch job's supervisor (hosts of the job, exec of a process)
  slurm_records  Slurm host lists and ``scontrol show -o`` records, parsed (pure)
"""

from .environment import GpuBindingError, visible_devices
from .plan import Plan, build_plan, fill, read_plan, write_plan

__all__ = [
    "GpuBindingError",
    "Plan",
    "build_plan",
    "fill",
    "read_plan",
    "visible_devices",
    "write_plan",
]
