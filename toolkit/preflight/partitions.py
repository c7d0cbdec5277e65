"""A Slurm job's shape checked on the login node against what Slurm says of its partitions, before anything is
written or submitted: a job the partition can never run would otherwise sit in the queue ("PartitionTimeLimit",
"PartitionNodeLimit") or be refused by sbatch after the run directory exists.

For each node group of the plan (the job, or each heterogeneous component): the partition exists (Slurm's default
one when none is named), its ``MaxTime`` holds ``slurm.time``, its ``MaxNodes`` and node count hold the group's
nodes, some of its nodes have the GPUs per node the group asks for (``sinfo``'s GRES) and the cores it asks per
node (the site's ``[cpus]``, ``sinfo``'s CPUs). A partition that is
not UP is a warning (the job waits). When Slurm cannot be asked (no ``scontrol`` here, no controller), nothing is
refused and a warning says the limits were not checked.

Stdlib only; the login node's commands: ``scontrol show partition -o`` and ``sinfo -h -N -o '%R %c %G'``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..config.errors import Findings
from ..config.slurm_time import parse_slurm_time
from ..placement.slurm_records import parse_scontrol_record

if TYPE_CHECKING:
    from toolkit.config.model import RLConfig
    from toolkit.placement.plan import Plan


QUERY_TIMEOUT_S = 30.0
_GPU_COUNT = re.compile(r"^gpu(?::[^:(]+)?:(\d+)")


@dataclass(frozen=True)
class Partition:
    """What Slurm says of one partition: ``max_time_s`` (None: unlimited), ``max_nodes`` (None: unlimited),
    ``total_nodes``, ``state`` (``UP``, ``DOWN``, ``DRAIN``, ``INACTIVE``), whether it is the cluster's default,
    and ``node_shapes``: each node's ``(cpus, gpus)`` (GRES ``gpu``)."""

    name: str
    max_time_s: int | None
    max_nodes: int | None
    total_nodes: int
    state: str
    default: bool
    node_shapes: tuple[tuple[int, int], ...] = ()

    @property
    def gpus_per_node(self) -> int:
        """The most GPUs any of its nodes has."""
        return max((g for _, g in self.node_shapes), default=0)

    def most_cpus(self, gpus: int) -> int:
        """The most CPUs of one node that also has at least ``gpus`` GPUs (0 when none has, or CPUs are unknown)."""
        return max((c for c, g in self.node_shapes if g >= gpus), default=0)


Runner = Callable[[list[str]], str]


def _run(argv: list[str]) -> str:
    """stdout of ``argv``; raises OSError or subprocess.SubprocessError (non-zero exit, timeout) when Slurm cannot
    be asked."""
    if shutil.which(argv[0]) is None:
        raise FileNotFoundError(f"{argv[0]} is not on PATH")
    r = subprocess.run(argv, capture_output=True, text=True, timeout=QUERY_TIMEOUT_S, check=False)
    if r.returncode != 0:
        raise subprocess.SubprocessError((r.stderr or r.stdout).strip().splitlines()[-1:] or [f"exit {r.returncode}"])
    return r.stdout


def _limit(value: str | None) -> int | None:
    """An integer field of a partition record; None for UNLIMITED (or absent)."""
    if value is None or value.upper() in ("UNLIMITED", "INFINITE", "N/A"):
        return None
    return int(value)


def gpus_of(gres: str) -> int:
    """GPUs in one node's ``sinfo %G`` text: ``gpu:4``, ``gpu:a100:8(S:0-1)``, ``gpu:a100:4,gpu:v100:2`` (6),
    ``(null)`` (0)."""
    total = 0
    for item in gres.split(","):
        m = _GPU_COUNT.match(item.strip())
        if m:
            total += int(m.group(1))
    return total


def read_partitions(run: Runner | None = None) -> dict[str, Partition]:
    """Every partition Slurm knows, by name; ``run`` runs a command and returns its stdout (default: the real
    one). Raises OSError / subprocess.SubprocessError when Slurm cannot be asked, ValueError for a record it cannot
    read."""
    run = run or _run
    # One sinfo for every partition: a line per node and partition, "<partition> <cpus> <gres>".
    # With -N each line is one node, so %c is that node's CPU count (no "64+" ranges).
    nodes: dict[str, list[tuple[int, int]]] = {}
    for line in run(["sinfo", "-h", "-N", "-o", "%R %c %G"]).splitlines():
        part, count, text = (line.strip().split(None, 2) + ["", ""])[:3]
        nodes.setdefault(part, []).append((int(count) if count.isdigit() else 0, gpus_of(text)))
    out: dict[str, Partition] = {}
    for line in run(["scontrol", "show", "partition", "-o"]).splitlines():
        rec = parse_scontrol_record(line.strip())
        name = rec.get("PartitionName")
        if not name:
            continue
        out[name] = Partition(
            name=name,
            max_time_s=parse_slurm_time(rec.get("MaxTime", "UNLIMITED")),
            max_nodes=_limit(rec.get("MaxNodes")),
            total_nodes=int(rec.get("TotalNodes", "0")),
            node_shapes=tuple(nodes.get(name, [])),
            state=rec.get("State", "UP"),
            default=rec.get("Default", "NO") == "YES",
        )
    return out


_live: tuple[Runner, dict[str, Partition]] | None = None


def _live_partitions() -> dict[str, Partition]:
    """This cluster's partitions, asked once per process (a sweep preflights every point); asked again when the
    runner was replaced (tests put one in place of Slurm)."""
    global _live
    if _live is None or _live[0] is not _run:
        _live = (_run, read_partitions(_run))
    return _live[1]


def check_partitions(cfg: RLConfig, plan: Plan, f: Findings, *, run: Runner | None = None) -> None:
    """Add an error to ``f`` for each node group of ``plan`` (``toolkit.placement.plan.Plan``) its partition can
    never run (see the module docstring), naming the config field and the partition's limit; a warning when the
    partition is not UP or Slurm cannot be asked. ``cfg``: the run config (``slurm.time``)."""
    try:
        parts = read_partitions(run) if run is not None else _live_partitions()
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        f.warn(
            "slurm.partition",
            f"cannot ask Slurm about its partitions ({e}); partition limits are not checked here, sbatch will",
        )
        return
    if not parts:
        return
    try:
        want_s = parse_slurm_time(cfg.slurm.time)
    except ValueError:
        want_s = None  # the config's own validation reports it
    default = next((p for p in parts.values() if p.default), None)
    for g in plan.groups:
        field = "slurm.partition" if g.index == 0 else "deployment.orchestrator_partition"
        p = parts.get(g.partition) if g.partition else default
        if p is None:
            named = (
                f"partition '{g.partition}' does not exist on this cluster"
                if g.partition
                else "no partition is named and the cluster has no default one"
            )
            f.error(field, f"{named}; partitions: {', '.join(sorted(parts))}")
            continue
        what = f"partition '{p.name}'" + ("" if g.index == 0 else " (the orchestrator's component)")
        if p.state.upper() not in ("UP",):
            f.warn(field, f"{what} is {p.state}: the job will wait until it is UP")
        limit = min(x for x in (p.max_nodes, p.total_nodes) if x is not None) if p.total_nodes else p.max_nodes
        if limit is not None and g.num_nodes > limit:
            why = "MaxNodes" if p.max_nodes is not None and p.max_nodes <= p.total_nodes else "nodes in it"
            f.error(
                "deployment",
                f"the job needs {g.num_nodes} nodes in {what}, which has at most {limit} "
                f"({why}); fewer nodes, or another partition ({field})",
            )
        if g.gpus_per_node > p.gpus_per_node:
            f.error(
                "deployment.gpus_per_node",
                f"{g.gpus_per_node} GPUs per node requested but no node of {what} "
                f"has more than {p.gpus_per_node} (GRES gpu)",
            )
        most = p.most_cpus(g.gpus_per_node)
        if g.cpus_per_node and most and g.cpus_per_node > most:
            gpus = f" with {g.gpus_per_node} GPUs" if g.gpus_per_node else ""
            f.error(
                "site [cpus]",
                f"{g.cpus_per_node} cores per node requested (--cpus-per-task) but no node{gpus} of {what} has "
                f"more than {most} CPUs; a smaller per_gpu / without_gpus in the site file, or a CPU option in "
                "slurm.extra_directives",
            )
        if g.index == 0 and want_s is not None and p.max_time_s is not None and want_s > p.max_time_s:
            f.error(
                "slurm.time",
                f"{cfg.slurm.time} is longer than {what} allows ({_clock(p.max_time_s)}, MaxTime); "
                "a shorter slurm.time (the run requeues and resumes from its checkpoints)",
            )

    _check_elastic(cfg, parts, f)


def _check_elastic(cfg: RLConfig, parts: dict[str, Partition], f: Findings) -> None:
    """``[deployment.elastic]``'s own partition exists and takes its replica jobs' time limit: replica jobs are
    submitted while the run trains, so a refusal then would come after the run's queue wait."""
    elastic = getattr(getattr(cfg, "deployment", None), "elastic", None)
    if elastic is None or not elastic.partition:
        return
    p = parts.get(elastic.partition)
    if p is None:
        f.error(
            "deployment.elastic.partition",
            f"partition '{elastic.partition}' does not exist on this cluster; partitions: {', '.join(sorted(parts))}",
        )
        return
    try:
        want_s = parse_slurm_time(elastic.time)
    except ValueError:
        return  # the config's own rules report it
    if p.max_time_s is not None and want_s > p.max_time_s:
        f.error(
            "deployment.elastic.time",
            f"{elastic.time} is longer than partition '{p.name}' allows ({_clock(p.max_time_s)}, MaxTime)",
        )


def _clock(seconds: int) -> str:
    d, rest = divmod(seconds, 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    return (f"{d}-" if d else "") + f"{h:02d}:{m:02d}:{s:02d}"
