"""Why a multi-node trainer's torchrun rendezvous failed, in the user's words: which trainer nodes never joined.

The plan gives torchrun a join timeout (``deployment.trainer_rendezvous_timeout_s``, see
:func:`toolkit.placement.plan.rendezvous_conf`): when not every trainer node has joined by then, the agents that
did raise ``RendezvousTimeoutError``; a node that cannot reach the rendezvous store on the first trainer node raises
``RendezvousConnectionError``. Either ends the trainer step (srun's ``--kill-on-bad-exit``), and the batch job's
supervisor asks :func:`rendezvous_failure` what to tell the user.

Each node of the step writes its own log (``trainer-<k>.log``, k = srun's ``%t``) and, just before it becomes
torchrun, a marker line (:data:`toolkit.placement.runtime.TORCHRUN_STARTING`). Logs are appended across requeues,
so the supervisor notes each node log's size before it starts the step (:meth:`StepLogs.mark`) and only what this
start wrote is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..placement.plan import fill
from ..placement.runtime import TORCHRUN_STARTING
from .progress import file_size

if TYPE_CHECKING:
    from toolkit.placement.plan import Plan


# torchrun's exception class names (torch.distributed.elastic.rendezvous.api), printed in its traceback.
RDZV_TIMEOUT = "RendezvousTimeoutError"
RDZV_CONNECTION = "RendezvousConnectionError"
# The config field users set; named in the message so they know what to raise.
TIMEOUT_FIELD = "deployment.trainer_rendezvous_timeout_s"


def node_logs(logs: Path, spec: Any) -> list[Path]:
    """The per-node log files of multi-node process ``spec`` under the attempt's log directory ``logs``, in srun's
    task order (node ``spec.node_index + k`` writes the k-th)."""
    stem = spec.log_name.removesuffix(".log")
    return [logs / f"{stem}-{k}.log" for k in range(spec.num_nodes)]


@dataclass
class StepLogs:
    """The per-node logs of one start of a multi-node step and, for each, its size in bytes before the start."""

    paths: list[Path]
    offsets: list[int]

    @classmethod
    def mark(cls, paths: list[Path]) -> StepLogs:
        """Note the current size of each of ``paths`` (0 for a log not written yet)."""
        return cls(list(paths), [file_size(p) for p in paths])

    def texts(self) -> list[str | None]:
        """What each node wrote since :meth:`mark` (None when its log does not exist)."""
        out: list[str | None] = []
        for p, off in zip(self.paths, self.offsets):
            try:
                with open(p, "rb") as f:
                    f.seek(off)
                    out.append(f.read().decode(errors="replace"))
            except OSError:
                out.append(None)
        return out


def _option(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv and argv.index(name) + 1 < len(argv) else None


def join_timeout_s(spec: Any) -> int | None:
    """The join timeout in the torchrun command of ``spec`` (``--rdzv-conf join_timeout=N``), None without one."""
    conf = _option(spec.command, "--rdzv-conf") or ""
    for item in conf.split(","):
        key, _, value = item.partition("=")
        if key.strip() == "join_timeout" and value.strip().isdigit():
            return int(value)
    return None


def rendezvous_failure(plan: Plan, spec: Any, texts: list[str | None], paths: list[Path]) -> str | None:
    """The message for a failed start of torchrun step ``spec`` of ``plan`` (hosts resolved) when its rendezvous
    did not complete, naming the trainer nodes that never joined; None when the step failed for another reason.

    ``texts``: what each node wrote to its log (``paths``, in srun's task order) during this start, None for a
    node without a log. A node without the marker line never started its torchrun; a node whose torchrun could not
    reach the store on the first trainer node never joined either (named only when every node started torchrun:
    otherwise it is the consequence, and the node that never started is the cause).
    """
    seen = [t or "" for t in texts]
    if not any(RDZV_TIMEOUT in t or RDZV_CONNECTION in t for t in seen):
        return None
    n = spec.num_nodes
    nodes = list(spec.node_indices)

    def who(k: int) -> str:
        host = plan.hosts[nodes[k]] if nodes[k] < len(plan.hosts) else f"node index {nodes[k]}"
        return f"{host} (trainer node {k} of {n}; log {paths[k]})"

    timeout = join_timeout_s(spec)
    head = (
        f"the torchrun rendezvous of the {n} trainer nodes did not complete"
        f"{f' within {timeout} s ({TIMEOUT_FIELD})' if timeout is not None else ''}"
    )
    # A node whose torchrun reported a rendezvous error started it, marker line or not.
    started = (TORCHRUN_STARTING, RDZV_TIMEOUT, RDZV_CONNECTION)
    never = [k for k, t in enumerate(seen) if not any(m in t for m in started)]
    if never:
        what = "its torchrun never started" if len(never) == 1 else "their torchrun never started"
        return f"{head}: {', '.join(who(k) for k in never)} did not join ({what})"
    unreachable = [k for k, t in enumerate(seen) if RDZV_CONNECTION in t]
    if unreachable:
        try:
            endpoint = fill(_option(spec.command, "--rdzv-endpoint") or "?", plan, None)
        except KeyError:
            endpoint = "the first trainer node"
        return (
            f"{head}: {', '.join(who(k) for k in unreachable)} did not join (could not reach the rendezvous "
            f"at {endpoint})"
        )
    return (
        f"{head}: every trainer node started torchrun, yet not all of them joined; see their logs: "
        f"{', '.join(str(p) for p in paths)}"
    )
