"""Placement: which process runs on which node and GPUs, with which ports, command and environment.

Public API: :func:`build_plan`, :func:`write_plan`, :func:`read_plan`, :class:`Plan`, :class:`ProcessSpec`,
:func:`derive_topology`, :func:`visible_devices`. Login-node safe (no torch, no vLLM).
"""

from .environment import GpuBindingError, visible_devices
from .plan import PlacementError, Plan, ProcessSpec, build_plan, fill, read_plan, write_plan
from .topology import Topology, TopologyError, derive_topology

__all__ = [
    "GpuBindingError",
    "PlacementError",
    "Plan",
    "ProcessSpec",
    "Topology",
    "TopologyError",
    "build_plan",
    "derive_topology",
    "fill",
    "read_plan",
    "visible_devices",
    "write_plan",
]
