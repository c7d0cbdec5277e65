"""The cost envelope of a Slurm job: what its allocation holds and the most it can use in one attempt.

A researcher submitting to a shared cluster wants the bill before the queue: the nodes and GPUs of each
heterogeneous component (with the processes placed on it, so a teacher's or an orchestrator's own node is visible)
times the job's time limit. The figure is an upper bound per attempt: a job that ends earlier uses less, and each
requeue of a preempted job starts another attempt with the same bound.
"""

from __future__ import annotations

from dataclasses import dataclass

from .plan import Plan


@dataclass(frozen=True)
class CostEnvelope:
    """Nodes and GPUs of the whole allocation and the most node-hours and GPU-hours one attempt can take
    (``None`` hours: the time limit is unlimited). ``groups``: one text per het group, e.g.
    ``"group 1: 1 node x 4 GPUs (partition gpu; teacher-0)"``."""

    nodes: int
    gpus: int
    node_hours: float | None
    gpu_hours: float | None
    groups: tuple[str, ...]

    def line(self) -> str:
        """One line for the dry run and the submission message."""
        hours = (
            f"at most {self.node_hours:.1f} node-hours and {self.gpu_hours:.1f} GPU-hours per attempt"
            if self.node_hours is not None and self.gpu_hours is not None
            else "no upper bound in time (the time limit is unlimited)"
        )
        return f"cost envelope: {self.nodes} node(s), {self.gpus} GPU(s): {'; '.join(self.groups)}; {hours}"


def cost_envelope(plan: Plan, time_limit_s: int | None) -> CostEnvelope:
    """The envelope of ``plan``'s allocation for a job of ``time_limit_s`` seconds (None: unlimited; parse the
    config's ``slurm.time`` with ``toolkit.config.slurm_time.parse_slurm_time``)."""
    texts, nodes, gpus = [], 0, 0
    for g in plan.groups:
        procs = [p.name for p in plan.processes if p.het_group == g.index]
        part = f"partition {g.partition}; " if g.partition else ""
        label = f"group {g.index}: " if plan.is_het else ""
        texts.append(
            f"{label}{g.num_nodes} node(s) x {g.gpus_per_node} GPU(s) ({part}{', '.join(procs) or 'no process'})"
        )
        nodes += g.num_nodes
        gpus += g.num_nodes * g.gpus_per_node
    hours = None if time_limit_s is None else time_limit_s / 3600.0
    return CostEnvelope(
        nodes=nodes,
        gpus=gpus,
        node_hours=None if hours is None else nodes * hours,
        gpu_hours=None if hours is None else gpus * hours,
        groups=tuple(texts),
    )
