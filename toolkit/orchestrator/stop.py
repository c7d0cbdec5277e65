"""Stop criteria (``[monitors.stop]``) and the zero-signal guard.

Each criterion looks at consecutive steps and, when it fires, returns a reason. The orchestrator then writes the
reason into the run's stop request (``control/STOP``), which makes the trainer checkpoint and both roles exit 0:
a stopped run is resumable, and the reason is in the file and in the log.

- errored share, mismatch KL and reward collapse: thresholds with patience, checked by ``toolkit.run.stop`` (the
  trainer's ``mismatch_kl/mean`` is read from ``metrics.jsonl``);
- zero signal: a step whose kept groups all had identical rewards, or whose groups were all
  filtered out, is *empty*; every empty step is warned about with its counts, and ``max_empty_steps`` in a row stop
  the run (None: warn only).
"""

from __future__ import annotations

import logging
from pathlib import Path

from toolkit.config.model import StopCriteria
from toolkit.run import metrics as metrics_file
from toolkit.run.stop import StopMonitor

log = logging.getLogger(__name__)


class ZeroSignalGuard:
    """Counts consecutive empty steps; ``max_empty_steps`` None never stops."""

    def __init__(self, max_empty_steps: int | None) -> None:
        self.max_empty_steps = max_empty_steps
        self.consecutive = 0

    def observe(
        self, step: int, *, groups_offered: int, groups_kept: int, signal_groups: int, dropped: dict[str, int]
    ) -> str | None:
        """Record one step (or one window of groups when a constant-size batch cannot fill); returns a stop
        reason when the limit is reached, else None. Warns on every empty step."""
        if signal_groups > 0:
            self.consecutive = 0
            return None
        self.consecutive += 1
        log.warning(
            "step %d has no learning signal: %d groups offered, %d kept, 0 with differing rewards; dropped %s "
            "(%d empty step(s) in a row%s)",
            step,
            groups_offered,
            groups_kept,
            dict(dropped) or "none",
            self.consecutive,
            f", stop after {self.max_empty_steps}" if self.max_empty_steps else "",
        )
        if self.max_empty_steps is not None and self.consecutive >= self.max_empty_steps:
            return (
                f"zero-signal guard: {self.consecutive} consecutive steps without any group with differing rewards "
                f"(last: {groups_offered} groups offered, dropped {dict(dropped) or 'none'}); fix task difficulty "
                "or the environment before training further"
            )
        return None


class StopChecks:
    """Evaluates ``monitors.stop`` after each orchestrator step.

    The thresholds themselves are checked by :class:`toolkit.run.stop.StopMonitor` (one implementation, replayed by
    reports too); this class feeds it the step's orchestrator metrics plus the newest trainer ``mismatch_kl/mean``
    read from ``metrics.jsonl``, and keeps the zero-signal guard.
    """

    def __init__(self, cfg: StopCriteria, metrics_path: Path) -> None:
        self.guard = ZeroSignalGuard(cfg.max_empty_steps)
        self.monitor = StopMonitor(cfg)
        self._trainer_lines = metrics_file.Follower(metrics_path)

    def check(self, step: int, metrics: dict[str, float]) -> str | None:
        """Feed one step (orchestrator metrics incl. ``errored_rollouts`` and ``rollouts_offered``); returns the
        stop reason when a criterion trips."""
        offered = metrics.get("rollouts_offered") or 0
        fed = dict(metrics)
        if offered:
            fed["errored_share"] = metrics.get("errored_rollouts", 0) / offered
        kl = self._newest_trainer_kl()
        fed.pop("mismatch_kl/mean", None)
        if kl is not None:
            fed["mismatch_kl/mean"] = kl
        return self.monitor.update(step, fed)

    def _newest_trainer_kl(self) -> float | None:
        """The newest trainer mismatch_kl/mean appended since the last call (None when none arrived)."""
        newest = None
        for rec in self._trainer_lines.new():
            kl = rec.get("mismatch_kl/mean")
            if rec.get("role") == metrics_file.TRAINER and isinstance(kl, (int, float)):
                newest = float(kl)
        return newest
