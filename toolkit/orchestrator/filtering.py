"""Online difficulty filtering: which groups carry learning signal.

Dropping exact all-0 and all-1 groups only fits binary rewards; a continuous reward almost never repeats exactly,
so groups are judged by thresholds on their spread and mean, never by equality with 0 and 1. So:

- ``uniform``: every valid reward in the group is the same (spread <= ``SPREAD_TOL``). Such a group has zero
  group-relative advantage under either estimator, whatever the reward scale. Reported split by value as
  ``all_zero`` (all <= 0), ``all_one`` (all >= 1) and ``uniform`` (any other common value).
- ``easy``: mean reward >= ``easy_threshold`` (when set).
- ``hard``: mean reward <= ``hard_threshold`` (when set).
- ``errored``: no valid (non-errored) rollout left in the group; dropped whether or not filtering is on, because
  errored rollouts never enter a batch.

Filtering off keeps every group with at least one valid rollout (uniform groups then train with zero advantage).
"""

from __future__ import annotations

from collections.abc import Sequence

SPREAD_TOL = 1e-9


def is_uniform(rewards: Sequence[float]) -> bool:
    """True when all rewards are equal within ``SPREAD_TOL`` (absolute). Empty or single-reward groups are."""
    return not rewards or (max(rewards) - min(rewards)) <= SPREAD_TOL


def uniform_kind(rewards: Sequence[float]) -> str:
    """``all_zero`` (all <= 0), ``all_one`` (all >= 1) or ``uniform`` for a group :func:`is_uniform` accepts."""
    if all(r <= 0.0 for r in rewards):
        return "all_zero"
    if all(r >= 1.0 for r in rewards):
        return "all_one"
    return "uniform"


def drop_reason(
    rewards: Sequence[float],
    *,
    enabled: bool,
    easy_threshold: float | None = None,
    hard_threshold: float | None = None,
) -> str | None:
    """Why a group with these valid rewards is dropped (``errored``, ``all_zero``, ``all_one``, ``uniform``,
    ``easy`` or ``hard``), or None to keep it.

    ``rewards`` are the rewards of the group's *valid* rollouts only. Uniform groups are checked first, so an
    all-1 binary group reads ``all_one`` rather than ``easy``.
    """
    if len(rewards) == 0:
        return "errored"
    if not enabled:
        return None
    if is_uniform(rewards):
        return uniform_kind(rewards)
    mean = sum(rewards) / len(rewards)
    if easy_threshold is not None and mean >= easy_threshold:
        return "easy"
    if hard_threshold is not None and mean <= hard_threshold:
        return "hard"
    return None


def solve_rates(groups: Sequence[Sequence[float]]) -> tuple[float, float]:
    """``(solve_none, solve_all)``: shares of groups whose valid rewards are all <= 0, resp. all >= 1.

    Groups without valid rewards are not counted; returns (0.0, 0.0) when no group has one.
    """
    scored = [g for g in groups if len(g)]
    if not scored:
        return 0.0, 0.0
    none = sum(all(r <= 0.0 for r in g) for g in scored)
    every = sum(all(r >= 1.0 for r in g) for g in scored)
    return none / len(scored), every / len(scored)
