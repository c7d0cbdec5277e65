"""Restart policy for crashed inference engines (``inference.max_restarts`` within ``inference.restart_window_s``).

Which components may be restarted, and why only those:

- an inference engine holds no state the run cannot rebuild: the weights it serves are the newest STABLE broadcast
  (or the base model), which the orchestrator pushes into it again once it answers (see
  ``toolkit.orchestrator.engines``); rollouts in flight on it are retried by the policy client;
- the trainer (optimizer state, the step in progress) and the orchestrator (batches, sampler state) are the run's
  state: a crash of either ends the run at once, naming the component, and ``--resume`` continues from the newest
  checkpoint without losing a completed step. The router is not restarted either (it is cheap, but a router death
  usually means a configuration or port problem that a restart would only repeat).

The budget is a sliding window, like systemd's ``StartLimitBurst``/``StartLimitIntervalSec``: at most
``max_restarts`` restarts in any ``window_s`` seconds (None: in the whole attempt). ``max_restarts = 0`` keeps
the behaviour without restarts: the first engine death ends the run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

RESTARTABLE_ROLES = ("inference",)


def is_restartable(role: str) -> bool:
    """Whether a component of ``role`` is restarted when it dies (only inference engines; see the module doc)."""
    return role in RESTARTABLE_ROLES


@dataclass
class RestartBudget:
    """Counts restarts of one component. ``max_restarts`` >= 0; ``window_s`` seconds or None (no expiry).

    Times are ``time.monotonic()`` seconds supplied by the caller, so the policy is testable without sleeping.
    """

    max_restarts: int
    window_s: float | None = None
    times: list[float] = field(default_factory=list)

    def _recent(self, now: float) -> list[float]:
        if self.window_s is None:
            return list(self.times)
        return [t for t in self.times if now - t < self.window_s]

    def used(self, now: float) -> int:
        """Restarts that count against the budget at ``now`` (those within the window)."""
        return len(self._recent(now))

    def try_restart(self, now: float) -> bool:
        """Record a restart at ``now`` and return True when the budget allows one; False (nothing recorded) when
        ``max_restarts`` restarts already happened within the window."""
        self.times = self._recent(now)
        if len(self.times) >= self.max_restarts:
            return False
        self.times.append(now)
        return True
