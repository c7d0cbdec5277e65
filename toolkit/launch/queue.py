"""Queue-aware placement: when would Slurm start this run, in its own shape and in smaller ones?

On a busy cluster the scarce thing is a large allocation that starts now. A run with several inference replicas
can also run with fewer (each replica is a copy of the policy; fewer only means fewer rollouts per second), so the
dry run shows, for the configured shape and for the same run with fewer inference replicas, the start time that
Slurm itself predicts: each shape's real batch script is rendered (into a scratch directory) and handed to
``sbatch --test-only``, which asks the controller's scheduler without queueing anything. Times come only from
Slurm; a shape for which Slurm gives no time (a site that refuses ``--test-only``, a shape the partition cannot
hold) says why instead.

``srl rl ... --start-soonest`` submits the shape that starts first (ties go to the larger shape) and says which.

Login-node code: no torch, no vLLM.
"""

from __future__ import annotations

import dataclasses
import re
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from ..config import ConfigError, LoadedConfig, RLConfig
from ..config.model import MultiNodeDeployment, infer_replica_fields
from ..config.site import SiteConfig
from ..placement.plan import launch_plan
from ..placement.topology import derive_topology
from ..render import render_job
from ..run.layout import RunDir
from . import slurm

# sbatch --test-only answers on stderr, e.g.
#   sbatch: Job 42 to start at 2026-12-06T06:30:05 using 8 processors on nodes n[1-3] in partition debug
_ANSWER_RE = re.compile(
    r"Job \d+ to start at (?P<start>\S+) using \d+ processors on nodes (?P<nodes>\S+)(?: in partition (?P<part>\S+))?"
)
# Most shapes shown: the configured one and up to three smaller ones.
MAX_SHAPES = 4
# sbatch's words when it could not ask the controller at all (then no shape gets an answer: one line says so).
_UNREACHABLE = ("Unable to contact slurm controller", "Zero Bytes were transmitted", "Socket timed out")


@dataclass(frozen=True)
class Shape:
    """One way to run the config: ``replicas`` inference replicas on ``nodes`` nodes in all (``config`` is the
    whole run config with that count; the configured shape has ``configured`` True)."""

    replicas: int
    nodes: int
    config: RLConfig
    configured: bool

    def label(self) -> str:
        own = ", the config's shape" if self.configured else ""
        return f"{self.nodes} node(s), {self.replicas} inference replica(s){own}"


@dataclass(frozen=True)
class Estimate:
    """Slurm's answer for one shape: ``start`` (local time of the controller) with the ``node_list`` and
    ``partition`` it would use, or ``start`` None and ``reason`` saying why there is no time."""

    shape: Shape
    start: datetime | None
    node_list: str | None = None
    partition: str | None = None
    reason: str | None = None
    site_wide: bool = False
    """True when the reason is Slurm itself (no sbatch, no controller): no other shape would get an answer."""

    def line(self, now: datetime) -> str:
        if self.site_wide:
            return f"Slurm gives no start times here ({self.reason})"
        if self.start is None:
            return f"{self.shape.label()}: Slurm gives no start time ({self.reason})"
        wait = max(0.0, (self.start - now).total_seconds())
        when = "now" if wait < 60 else f"in {_duration(wait)}"
        where = f" on {self.node_list}" + (f" in partition {self.partition}" if self.partition else "")
        return f"{self.shape.label()}: starts {when} ({self.start:%Y-%m-%d %H:%M:%S}){where}"


def _duration(seconds: float) -> str:
    minutes = int(seconds // 60)
    if minutes < 120:
        return f"{minutes} min"
    return f"{minutes // 60} h {minutes % 60:02d} min"


def parse_test_only(text: str) -> tuple[datetime, str, str | None] | None:
    """``(start, node list, partition or None)`` from the output of ``sbatch --test-only``; None when it holds no
    start time. The time is the controller's local time, as Slurm prints it (``YYYY-MM-DDTHH:MM:SS``)."""
    m = _ANSWER_RE.search(text)
    if m is None:
        return None
    try:
        start = datetime.strptime(m.group("start"), "%Y-%m-%dT%H:%M:%S")
    except ValueError:
        return None
    return start, m.group("nodes"), m.group("part")


def shapes(cfg: RLConfig) -> list[Shape]:
    """The configured shape first, then the same run with fewer inference replicas (a multi-node deployment with
    more than one replica only; at most ``MAX_SHAPES`` in all, one replica always among them). Each config is
    validated as the run config it is. Raises pydantic's ValidationError only if the configured config itself is
    invalid."""
    dep = cfg.deployment
    own = Shape(_replicas(cfg), _nodes(cfg), cfg, True)
    if not isinstance(dep, MultiNodeDeployment) or dep.num_infer_replicas <= 1:
        return [own]
    total = dep.num_infer_replicas
    smaller = sorted({total - 1, total // 2, total // 4, 1} - {0, total}, reverse=True)
    if len(smaller) > MAX_SHAPES - 1:
        smaller = smaller[: MAX_SHAPES - 2] + [1]
    out = [own]
    for r in smaller:
        variant = _with_replicas(cfg, r)
        out.append(Shape(r, _nodes(variant), variant, False))
    return out


def _replicas(cfg: RLConfig) -> int:
    dep = cfg.deployment
    return dep.num_infer_replicas if isinstance(dep, MultiNodeDeployment) else 1


def _nodes(cfg: RLConfig) -> int:
    """Nodes the job requests (``#SBATCH --nodes``), as the placement derives them."""
    return derive_topology(cfg).num_nodes


def _with_replicas(cfg: RLConfig, replicas: int) -> RLConfig:
    """``cfg`` with ``replicas`` inference replicas (:func:`toolkit.config.model.infer_replica_fields`)."""
    data = cfg.model_dump()
    data["deployment"].update(infer_replica_fields(cfg, replicas))
    return RLConfig.model_validate(data)


def estimate(
    shape: Shape,
    site: SiteConfig,
    run: RunDir,
    *,
    kind: str,
    roles: tuple[str, ...],
    timeout_s: float,
    script: Path | None = None,
) -> Estimate:
    """Ask Slurm when ``shape`` would start: ``script`` (the shape's batch script, already rendered) or else one
    rendered into a scratch copy of the run directory (nothing of ``run`` is written), given to ``sbatch
    --test-only``. Never raises for Slurm's refusals: they become the estimate's ``reason``."""
    if script is not None:
        return _predict(shape, script, cwd=script.parent, timeout_s=timeout_s)
    with tempfile.TemporaryDirectory(prefix="srl-shape-") as tmp:
        scratch = RunDir(Path(tmp) / run.root.name)
        plan = launch_plan(shape.config, site, scratch, roles=roles)
        rendered = render_job(shape.config, scratch, plan, kind, attempt=1, site=site)
        return _predict(shape, rendered, cwd=Path(tmp), timeout_s=timeout_s)


def _predict(shape: Shape, script: Path, *, cwd: Path, timeout_s: float) -> Estimate:
    try:
        out = slurm.predict_start(script, cwd=cwd, timeout_s=timeout_s)
    except slurm.SlurmCommandError as e:
        reason = _last_line(e.stderr) or e.what or "sbatch --test-only failed"
        site_wide = e.returncode is None or any(s in reason for s in _UNREACHABLE)
        return Estimate(shape, None, reason=reason, site_wide=site_wide)
    parsed = parse_test_only(out)
    if parsed is None:
        return Estimate(shape, None, reason=f"sbatch --test-only printed no start time: {_last_line(out)!r}")
    start, nodes, part = parsed
    return Estimate(shape, start, nodes, part)


def _last_line(text: str | None) -> str:
    """The last non-empty line of ``text`` (sbatch prints its verdict last, after any warnings)."""
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def estimates(
    cfg: RLConfig,
    site: SiteConfig,
    run: RunDir,
    *,
    kind: str = "rl",
    roles: tuple[str, ...],
    timeout_s: float = 30.0,
    script: Path | None = None,
) -> list[Estimate]:
    """Slurm's start estimate for every shape of :func:`shapes`, the configured one first (from ``script``, its
    batch script, when the launch rendered it already: its plan is not built twice); a single site-wide estimate
    (``site_wide``) when Slurm could not be asked at all (its client waits about 20 s for an unreachable
    controller, so the other shapes are not tried)."""
    out = []
    for shape in shapes(cfg):
        own = script if shape.configured else None
        found = estimate(shape, site, run, kind=kind, roles=roles, timeout_s=timeout_s, script=own)
        if found.site_wide:
            return [found]
        out.append(found)
    return out


def soonest(found: Sequence[Estimate]) -> Estimate | None:
    """The estimate that starts first; a tie goes to the shape with more replicas (listed earlier). None when
    Slurm gave no time for any shape."""
    timed = [e for e in found if e.start is not None]
    return min(timed, key=lambda e: (e.start, -e.shape.replicas)) if timed else None


def print_estimates(found: Sequence[Estimate], *, file=None) -> None:
    """One line per shape, as Slurm predicts it now."""
    out = file or sys.stdout
    now = datetime.now()
    for e in found:
        print(f"start estimate: {e.line(now)}", file=out)


def choose_soonest(loaded: LoadedConfig, site: SiteConfig, run: RunDir, *, roles: tuple[str, ...]) -> LoadedConfig:
    """``--start-soonest``: the config of the shape Slurm starts first, with the estimates printed. Raises
    ConfigError naming the flag when the site has no Slurm, or when Slurm gave no start time for any shape (then
    nothing is submitted: the user decides)."""
    if not site.is_slurm:
        raise ConfigError(f"--start-soonest asks Slurm when each shape would start; site '{site.name}' has no Slurm")
    found = estimates(loaded.config, site, run, roles=roles)
    print_estimates(found)
    best = soonest(found)
    if best is None:
        raise ConfigError(
            "--start-soonest: Slurm gave no start time for any shape (see the lines above); nothing submitted"
        )
    if best.shape.configured:
        print("start-soonest: submitting the config's own shape")
        return loaded
    print(
        f"start-soonest: submitting {best.shape.label()} instead of {found[0].shape.label()} "
        f"(deployment.num_infer_replicas = {best.shape.replicas}); it starts first"
    )
    return dataclasses.replace(loaded, config=best.shape.config)
