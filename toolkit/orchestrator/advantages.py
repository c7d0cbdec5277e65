"""Group-relative advantages of one group of rollouts (rollouts of the same task).

Two estimators (``orchestrator.train.algo.type``):

- ``grpo``: ``A_i = r_i - mean(r)``. GRPO (Shao et al. 2024, "DeepSeekMath", eq. 3) also divides by the group's
  standard deviation; like Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training", sec. 3.1) srl leaves
  the division out, because it over-weights groups with little reward spread.
- ``max_rl``: ``A_i = (r_i - mean(r)) / mean(r)``: the centred reward divided by the group's mean (for binary
  rewards the empirical pass rate), the maximum-likelihood RL weighting, which scales up the signal of tasks the
  policy rarely solves. A group whose mean is not positive (within ``EPS``) carries no usable signal and gets zeros.

The optional length penalty is applied to the reward *before* centring:
``r_i' = r_i - length_penalty * completion_tokens_i / max_completion_tokens``.
"""

from __future__ import annotations

from collections.abc import Sequence

EPS = 1e-8
ALGOS = ("grpo", "max_rl")


def penalized_rewards(
    rewards: Sequence[float],
    completion_lens: Sequence[int] | None = None,
    *,
    length_penalty: float = 0.0,
    max_completion_tokens: int | None = None,
) -> list[float]:
    """Rewards minus ``length_penalty * completion_len / max_completion_tokens`` (lengths in tokens).

    Returns the rewards unchanged when ``length_penalty`` is 0. Raises ValueError when a penalty is set without
    ``completion_lens`` (one per reward) or with ``max_completion_tokens`` < 1.
    """
    out = [float(r) for r in rewards]
    if not length_penalty:
        return out
    if completion_lens is None or len(completion_lens) != len(out):
        raise ValueError("length_penalty needs one completion length per reward")
    if not max_completion_tokens or max_completion_tokens < 1:
        raise ValueError("length_penalty needs max_completion_tokens >= 1")
    return [r - length_penalty * n / max_completion_tokens for r, n in zip(out, completion_lens, strict=True)]


def group_advantages(rewards: Sequence[float], algo: str = "grpo") -> list[float]:
    """Advantages of one group: one float per reward, same order. An empty group gives an empty list.

    ``algo`` is ``grpo`` or ``max_rl`` (see the module docstring). A group of one rollout, or one whose rewards are
    all equal, gets all zeros (no relative signal). Raises ValueError for an unknown ``algo``.
    """
    if algo not in ALGOS:
        raise ValueError(f"unknown advantage algo {algo!r}; expected one of {ALGOS}")
    n = len(rewards)
    if n == 0:
        return []
    mean = sum(rewards) / n
    centred = [float(r) - mean for r in rewards]
    if algo == "grpo":
        return centred
    if mean <= EPS:
        return [0.0] * n
    return [c / mean for c in centred]
