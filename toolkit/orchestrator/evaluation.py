"""Periodic evaluation on held-out tasks: avg@k and pass@k per eval env.

For each eval env the first ``num_examples`` selected examples of its (test) split are each rolled out ``k =
group_size`` times with the eval sampling. ``avg@k`` is the mean reward over all valid rollouts of all examples;
``pass@k`` is the share of examples with at least one correct rollout among its k, a rollout being correct when its
reward >= ``CORRECT_AT`` (1.0: a full solve; continuous partial credit does not count). With n = k samples per
example the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models Trained on Code", eq. 1),
``1 - C(n-c, k) / C(n, k)``, reduces to exactly this; :func:`pass_at_k` implements the general form. Errored
rollouts are excluded from both and counted (``eval/<env>/errored``). The eval at step 0 is the baseline of the
untrained policy.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from toolkit.orchestrator.producer import Slots
from toolkit.run.types import Rollout, SamplingParams

CORRECT_AT = 1.0


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` are correct (Chen et al. 2021, eq. 1).

    Raises ValueError unless 0 <= c <= n and 1 <= k <= n.
    """
    if not (0 <= c <= n) or not (1 <= k <= n):
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def eval_metrics(env: str, groups: Sequence[Sequence[Rollout]], k: int) -> dict[str, float]:
    """``eval/<env>/avg@k``, ``eval/<env>/pass@k``, ``eval/<env>/errored`` and ``eval/<env>/examples``.

    Each group is one example's rollouts. An example whose rollouts all errored is left out of pass@k.
    """
    rewards: list[float] = []
    passes: list[float] = []
    errored = 0
    for group in groups:
        valid = [r for r in group if r.error_class is None]
        errored += len(group) - len(valid)
        rewards.extend(r.reward for r in valid)
        if valid:
            correct = sum(r.reward >= CORRECT_AT for r in valid)
            passes.append(pass_at_k(len(valid), correct, min(k, len(valid))))
    return {
        f"eval/{env}/avg@{k}": sum(rewards) / len(rewards) if rewards else 0.0,
        f"eval/{env}/pass@{k}": sum(passes) / len(passes) if passes else 0.0,
        f"eval/{env}/errored": float(errored),
        f"eval/{env}/examples": float(len(groups)),
    }


@dataclass
class EvalEnv:
    """One eval env ready to run: its started ``EnvRuntime``, examples, k and sampling."""

    name: str
    runtime: Any
    num_examples: int
    group_size: int
    sampling: SamplingParams


async def run_eval(
    envs: Sequence[EvalEnv], client: Any, *, max_concurrent: int
) -> tuple[dict[str, float], list[Rollout]]:
    """Evaluate every env; returns (metrics, all rollouts). ``max_concurrent`` bounds rollouts in flight."""
    slots = Slots(max_concurrent)
    metrics: dict[str, float] = {}
    everything: list[Rollout] = []

    async def one(env: EvalEnv, example: int) -> list[Rollout]:
        k = env.group_size
        async with slots.hold(k):
            group = await env.runtime.run_group(example, k, client=client, sampling=env.sampling)
        for r in group:
            r.group_id = example
        return group

    for env in envs:
        examples = env.runtime.example_ids(env.num_examples)
        groups = await asyncio.gather(*(one(env, ex) for ex in examples))
        metrics.update(eval_metrics(env.name, groups, env.group_size))
        everything += [r for g in groups for r in g]
    return metrics, everything
