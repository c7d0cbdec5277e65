"""Periodic evaluation on held-out tasks: avg@k and pass@k per eval env, each with its standard error.

For each eval env the first ``num_examples`` selected examples (tasks) of its (test) split are each rolled out
``k = group_size`` times with the eval sampling. Per task i with ``n_i`` valid rollouts:

- its score ``a_i`` is the mean reward of those rollouts, and ``avg@k`` is the mean of ``a_i`` over the tasks;
- its pass value ``p_i`` is 1 when at least one of its rollouts is correct, a rollout being correct when its
  reward >= ``CORRECT_AT`` (1.0: a full solve; continuous partial credit does not count), and ``pass@k`` is the
  mean of ``p_i``. With n = k samples per task the unbiased estimator of Chen et al. 2021 ("Evaluating Large
  Language Models Trained on Code", eq. 1), ``1 - C(n-c, k) / C(n, k)``, reduces to exactly this;
  :func:`pass_at_k` implements the general form (used as is when errors leave a task fewer than k valid rollouts).

Standard errors (``eval/<env>/avg@k/stderr``, ``eval/<env>/pass@k/stderr``) are those of a mean over tasks::

    stderr = sqrt( sum_i (x_i - mean(x))^2 / (m - 1) ) / sqrt(m)

with ``x_i`` the per-task score (``a_i`` or ``p_i``) and ``m`` the number of tasks with a valid rollout. They count
both sources of noise a reading has, the draw of the tasks and the sampling within each task, since the spread of
the per-task means contains both. With fewer than two such tasks there is no estimate and the key is left out.

With a seed (:class:`EvalEnv`, from ``orchestrator.eval.seed`` or the eval sampling's ``seed``), draws are the same at
every eval point: task i's rollout j samples with the engine seed ``seed + i * k + j``, so two points of one run
differ by the policy, not by the luck of the draw, and their difference is more precise than either reading's
standard error suggests. Without one the engine samples with its own randomness (vLLM on CPU cannot take seeds
reliably: see the config field).

Errored rollouts are excluded from all of these and counted (``eval/<env>/errored``); a task whose rollouts all
errored is left out. ``eval/<env>/examples`` is the number of tasks asked for. The eval at step 0 is the baseline
of the untrained policy.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from toolkit.orchestrator.producer import Slots
from toolkit.run.types import Rollout, SamplingParams

CORRECT_AT = 1.0
# Engine seeds are int64 (vLLM); seeds derived for a task stay below this, leaving room for ``+ j`` within a group.
_SEED_SPAN = 2**62


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` are correct (Chen et al. 2021, eq. 1).

    Raises ValueError unless 0 <= c <= n and 1 <= k <= n.
    """
    if not (0 <= c <= n) or not (1 <= k <= n):
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def mean_and_stderr(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean of ``values`` and its standard error ``s / sqrt(m)`` (``s`` the sample standard deviation, ddof 1, of
    the ``m`` values). The error is None for fewer than two values; the mean of no values is 0.0."""
    m = len(values)
    if m == 0:
        return 0.0, None
    mean = math.fsum(values) / m
    if m < 2:
        return mean, None
    var = math.fsum((v - mean) ** 2 for v in values) / (m - 1)
    return mean, math.sqrt(var / m)


def eval_metrics(env: str, groups: Sequence[Sequence[Rollout]], k: int) -> dict[str, float]:
    """``eval/<env>/avg@k``, ``eval/<env>/pass@k``, their ``/stderr``, ``eval/<env>/errored`` and
    ``eval/<env>/examples`` (see the module docstring for the definitions), and ``eval/<env>/metric/<name>`` (with
    ``/stderr``) for each metric the taskset reports: the mean over tasks of each task's mean.

    Each group is one task's rollouts. A task whose rollouts all errored is left out of the scores.
    """
    scores: list[float] = []
    passes: list[float] = []
    # The taskset's own metrics (tool calls made, a sub-goal reached): per task the mean over its valid rollouts
    # that report it; summarised over the tasks like avg@k.
    per_task: dict[str, list[float]] = {}
    errored = 0
    for group in groups:
        valid = [r for r in group if r.error_class is None]
        errored += len(group) - len(valid)
        if valid:
            scores.append(math.fsum(r.reward for r in valid) / len(valid))
            correct = sum(r.reward >= CORRECT_AT for r in valid)
            passes.append(pass_at_k(len(valid), correct, min(k, len(valid))))
        for name in sorted({n for r in valid for n in r.metrics}):
            values = [r.metrics[name] for r in valid if name in r.metrics]
            per_task.setdefault(name, []).append(math.fsum(values) / len(values))
    out: dict[str, float] = {}
    summaries = {f"avg@{k}": scores, f"pass@{k}": passes, **{f"metric/{n}": v for n, v in per_task.items()}}
    for name, values in summaries.items():
        mean, stderr = mean_and_stderr(values)
        out[f"eval/{env}/{name}"] = mean
        if stderr is not None:
            out[f"eval/{env}/{name}/stderr"] = stderr
    out[f"eval/{env}/errored"] = float(errored)
    out[f"eval/{env}/examples"] = float(len(groups))
    return out


def task_seed(seed: int, example: int, k: int) -> int:
    """Engine seed of rollout 0 of ``example`` (rollout j adds j): ``(seed + example * k) mod 2**62``."""
    return (seed + example * k) % _SEED_SPAN


@dataclass
class EvalEnv:
    """One eval env ready to run: its started ``EnvRuntime``, examples, k, sampling and the base ``seed`` of its
    draws (the same at every eval point; None: the engine's randomness; see the module docstring)."""

    name: str
    runtime: Any
    num_examples: int
    group_size: int
    sampling: SamplingParams
    seed: int | None = None


async def run_eval(
    envs: Sequence[EvalEnv], client: Any, *, max_concurrent: int, on_group: Callable[[], None] | None = None
) -> tuple[dict[str, float], list[Rollout]]:
    """Evaluate every env; returns (metrics, all rollouts). ``max_concurrent`` bounds rollouts in flight;
    ``on_group`` is called once per finished group (the orchestrator counts it as progress)."""
    slots = Slots(max_concurrent)
    metrics: dict[str, float] = {}
    everything: list[Rollout] = []

    async def one(env: EvalEnv, example: int) -> list[Rollout]:
        k = env.group_size
        sampling = env.sampling
        if env.seed is not None:
            sampling = dataclasses.replace(sampling, seed=task_seed(env.seed, example, k))
        async with slots.hold(k):
            group = await env.runtime.run_group(example, k, client=client, sampling=sampling)
        for r in group:
            r.group_id = example
        if on_group is not None:
            on_group()
        return group

    for env in envs:
        examples = env.runtime.example_ids(env.num_examples)
        groups = await asyncio.gather(*(one(env, ex) for ex in examples))
        metrics.update(eval_metrics(env.name, groups, env.group_size))
        everything += [r for g in groups for r in g]
    return metrics, everything
