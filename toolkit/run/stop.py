"""Stop criteria (``[monitors.stop]``): decide from per-step metrics when a run should stop itself.

The orchestrator feeds each step's metrics to a :class:`StopMonitor`; when it returns a reason, the orchestrator
writes a checkpoint, requests a clean stop and logs the reason. Reports replay ``metrics.jsonl`` through the same
monitor (:func:`replay`) to show whether and when the criteria tripped. The thresholds and their defaults are the
config's :class:`toolkit.config.model.StopCriteria`. Pure Python, no pandas or numpy, so the orchestrator imports it
for free.

Criteria (each off when its threshold is None):

- errored rollouts: ``errored_share`` (errored / all rollouts of the step, 0-1) above ``max_errored_share`` for
  ``errored_patience_steps`` consecutive steps. Errors are an environment or provider failure (outside
  the policy); training on the remaining rollouts wastes the allocation.
- mismatch KL: trainer ``mismatch_kl/mean`` above ``max_mismatch_kl`` for ``mismatch_kl_patience_steps``
  consecutive steps: the trainer and inference policies have drifted apart.
- reward collapse: ``reward/all/mean`` below ``reward_collapse_fraction`` x the best value so far for
  ``reward_collapse_patience_steps`` consecutive steps (only once the best is above 0).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from toolkit.config.errors import pydantic_issues
from toolkit.config.model import StopCriteria


def criteria_from_table(table: Mapping[str, Any] | None) -> StopCriteria:
    """Thresholds from a ``[monitors.stop]`` table (a run's resolved config holds every field; a missing one takes
    the config's default). Raises ``ValueError`` naming unknown keys or bad values."""
    try:
        return StopCriteria.model_validate(dict(table or {}))
    except ValidationError as e:
        raise ValueError("; ".join(f"monitors.stop.{i}" for i in pydantic_issues(e, StopCriteria))) from None


@dataclass
class StopMonitor:
    """Stateful check of :class:`StopCriteria` over consecutive steps (state is small; restore with a new monitor
    replayed over past metrics after a resume)."""

    criteria: StopCriteria
    _streaks: dict[str, int] = field(default_factory=lambda: {"errored": 0, "kl": 0, "reward": 0})
    _best_reward: float = -math.inf

    def _streak(self, name: str, over: bool, patience: int) -> bool:
        """Count one more step over the limit (``over``) or restart the count; True once it reaches ``patience``."""
        self._streaks[name] = self._streaks[name] + 1 if over else 0
        return self._streaks[name] >= patience

    def update(self, step: int, metrics: Mapping[str, float]) -> str | None:
        """Feed one step's metrics (keys ``errored_share``, ``mismatch_kl/mean``, ``reward/all/mean``; missing keys
        leave their streak unchanged). Returns the stop reason when a criterion trips, else None."""
        c = self.criteria
        reasons = []
        share = _num(metrics.get("errored_share"))
        if (
            c.max_errored_share is not None
            and share is not None
            and self._streak("errored", share > c.max_errored_share, c.errored_patience_steps)
        ):
            reasons.append(
                f"errored rollouts {share:.0%} > {c.max_errored_share:.0%} for {self._streaks['errored']} steps"
            )
        kl = _num(metrics.get("mismatch_kl/mean"))
        if (
            c.max_mismatch_kl is not None
            and kl is not None
            and self._streak("kl", kl > c.max_mismatch_kl, c.mismatch_kl_patience_steps)
        ):
            reasons.append(f"mismatch_kl {kl:.3g} > {c.max_mismatch_kl:g} for {self._streaks['kl']} steps")
        reward = _num(metrics.get("reward/all/mean"))
        if c.reward_collapse_fraction is not None and reward is not None:
            self._best_reward = max(self._best_reward, reward)
            collapsed = self._best_reward > 0 and reward < c.reward_collapse_fraction * self._best_reward
            if self._streak("reward", collapsed, c.reward_collapse_patience_steps):
                reasons.append(
                    f"reward collapsed to {reward:.3g} (< {c.reward_collapse_fraction:g} x best "
                    f"{self._best_reward:.3g}) for {self._streaks['reward']} steps"
                )
        return f"step {step}: " + "; ".join(reasons) if reasons else None


def replay(criteria: StopCriteria, steps: Iterable[tuple[int, Mapping[str, float]]]) -> tuple[int, str] | None:
    """First ``(step, reason)`` at which ``criteria`` trip over ``steps`` (ascending (step, metrics) pairs)."""
    monitor = StopMonitor(criteria)
    for step, metrics in steps:
        reason = monitor.update(step, metrics)
        if reason:
            return (step, reason)
    return None


def _num(v: Any) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x
