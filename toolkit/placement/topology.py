"""Node arithmetic of a deployment, derived once and used by validation, placement and templates.

Two places computing the same count with different formulas disagree sooner or later; here every count
(total nodes, role node ranges, trainer data-parallel size, engines per node) is computed in one function.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..config.model import implied_infer_nodes
from ..config.passthrough import vllm_tp

if TYPE_CHECKING:
    from toolkit.config.model import RLConfig


@dataclass(frozen=True)
class Island:
    """One inference replica: node indices (within the allocation) per role."""

    index: int
    nodes: tuple[int, ...]  # all nodes of this island
    prefill_nodes: tuple[tuple[int, ...], ...] = ()  # per prefill replica
    decode_nodes: tuple[tuple[int, ...], ...] = ()  # per decode replica


@dataclass(frozen=True)
class Topology:
    """Derived node layout of one RL job.

    ``num_nodes`` is what ``#SBATCH --nodes`` requests. Node indices are positions in the allocation's host list.
    ``trainer_dp`` = trainer GPUs / (tp * cp); on CPU (no GPUs) trainer nodes / (tp * cp), one rank
    per node. GPU counts are per node.
    """

    num_nodes: int
    gpus_per_node: int
    islands: tuple[Island, ...]
    trainer_nodes: tuple[int, ...]
    orchestrator_node: int
    router_node: int | None
    infer_tp: int
    engines_per_node: int
    trainer_dp: int
    orchestrator_het_group: int = 0
    """1 when the orchestrator runs as a heterogeneous-job component on its own (CPU) node; its node index is
    then ``num_nodes`` (the first node after the GPU group), not counted in ``num_nodes``."""

    @property
    def inference_nodes(self) -> tuple[int, ...]:
        return tuple(n for isl in self.islands for n in isl.nodes)

    def describe(self) -> str:
        """Human-readable derivation, used in error messages."""
        inf = ", ".join(f"island {i.index}: nodes {list(i.nodes)}" for i in self.islands) or "none"
        return (
            f"{self.num_nodes} nodes = inference [{inf}] + trainer {list(self.trainer_nodes)}"
            f" + orchestrator on node {self.orchestrator_node}"
        )


class TopologyError(ValueError):
    """A deployment whose arithmetic does not add up; the message shows the numbers."""


def derive_topology(cfg: RLConfig) -> Topology:
    """Derive the node layout from an ``RLConfig``. Raises TopologyError with both numbers when counts disagree."""
    dep = cfg.deployment
    infer = cfg.inference.deployment
    tp = vllm_tp(cfg.inference.vllm)
    gpn = dep.gpus_per_node

    if dep.type == "single_node":
        # Everything on one node; GPUs split between trainer and inference by count.
        engines = infer.num_replicas if infer.type == "single_node" else 1
        return Topology(
            num_nodes=1,
            gpus_per_node=gpn,
            islands=(Island(0, (0,)),),
            trainer_nodes=(0,),
            orchestrator_node=0,
            router_node=0 if (engines > 1 or infer.type == "disaggregated") else None,
            infer_tp=tp,
            engines_per_node=engines,
            # CPU-only node: cpu_train_ranks gloo ranks under torchrun (the plan's --nproc-per-node), all data parallel.
            trainer_dp=(
                max(1, dep.num_train_gpus // max(1, cfg.trainer.tp * cfg.trainer.cp)) if gpn else dep.cpu_train_ranks
            ),
        )

    # multi_node: islands first, then trainer nodes, then (optionally) the orchestrator's own node.
    per_island = implied_infer_nodes(infer)
    implied_infer = per_island * dep.num_infer_replicas
    if dep.num_infer_nodes is not None and dep.num_infer_nodes != implied_infer:
        raise TopologyError(
            f"deployment.num_infer_nodes = {dep.num_infer_nodes}, but [inference.deployment] ({infer.type}) implies "
            f"{per_island} node(s) per replica x {dep.num_infer_replicas} replica(s) = {implied_infer}; leave "
            "num_infer_nodes out to have it derived"
        )
    islands = []
    cursor = 0
    for i in range(dep.num_infer_replicas):
        nodes = tuple(range(cursor, cursor + per_island))
        pre: tuple[tuple[int, ...], ...] = ()
        dec: tuple[tuple[int, ...], ...] = ()
        if infer.type == "disaggregated":  # prefill replicas first, then decode, each on consecutive nodes
            p, d = infer.prefill_nodes_per_replica, infer.decode_nodes_per_replica
            pre = tuple(tuple(range(cursor + r * p, cursor + (r + 1) * p)) for r in range(infer.num_prefill_replicas))
            first = cursor + p * infer.num_prefill_replicas
            dec = tuple(tuple(range(first + r * d, first + (r + 1) * d)) for r in range(infer.num_decode_replicas))
        islands.append(Island(i, nodes, pre, dec))
        cursor += per_island
    trainer_nodes = tuple(range(cursor, cursor + dep.num_train_nodes))
    cursor += dep.num_train_nodes
    het = 0
    if dep.orchestrator_partition is not None:
        orch, het = cursor, 1  # het component 1: not part of the GPU group's node count
    elif dep.orchestrator == "own_node":
        orch = cursor
        cursor += 1
    elif dep.orchestrator == "with_trainer":
        orch = trainer_nodes[0]
    else:
        orch = islands[0].nodes[0]
    total = cursor
    if dep.nodes is not None and dep.nodes != total:
        topo_desc = f"inference {dep.num_infer_replicas} x {per_island} + trainer {dep.num_train_nodes}" + (
            " + orchestrator 1" if orch == total - 1 and dep.orchestrator == "own_node" else ""
        )
        raise TopologyError(f"deployment.nodes = {dep.nodes}, but the layout needs {total} nodes ({topo_desc})")
    trainer_gpus = dep.num_train_nodes * gpn
    par = cfg.trainer.tp * cfg.trainer.cp
    if trainer_gpus and trainer_gpus % par:
        raise TopologyError(
            f"trainer tp x cp = {cfg.trainer.tp} x {cfg.trainer.cp} = {par} does not divide the "
            f"{trainer_gpus} trainer GPUs ({dep.num_train_nodes} nodes x {gpn})"
        )
    return Topology(
        num_nodes=total,
        gpus_per_node=gpn,
        islands=tuple(islands),
        trainer_nodes=trainer_nodes,
        orchestrator_node=orch,
        router_node=islands[0].nodes[0] if islands else None,
        infer_tp=tp,
        engines_per_node=max(1, gpn // tp) if gpn else 1,
        # CPU trainer: one rank per node (the plan's torchrun --nproc-per-node is 1 without GPUs).
        trainer_dp=max(1, (trainer_gpus or dep.num_train_nodes) // par),
        orchestrator_het_group=het,
    )
