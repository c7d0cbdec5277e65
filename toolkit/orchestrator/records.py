"""What the orchestrator records per step: one metrics line in ``metrics.jsonl`` (rollouts: ``writer.py``).

Metric names (one line per step, ``role = "orchestrator"``; counts are rollouts unless named groups, lengths are
tokens, times seconds):

- ``reward/all/{mean,max,min}``, ``reward/<env>/{mean,max,min}``: valid rollouts of fresh groups (kept or filtered:
  the policy's reward, before filtering biases it); ``reward/<env>/seat/<seat>/{mean,max,min}`` for an env whose
  rollouts come from several agent seats (verifiers' ``agent.name``: the players of a game);
- ``solve_none``, ``solve_all``: shares of fresh groups with all rewards <= 0, resp. >= 1;
- ``effective_batch_size``: rollouts in the batch; ``batch/<env>/rollouts`` its env mix;
- ``errored_rollouts`` (+ ``errored_rollouts/<env>``, ``error/<class>``), ``truncated_rollouts`` (+ per env);
- ``seq_len/mean`` (prompt + completion tokens of the batch's samples per rollout), ``completion_len/mean``
  (policy-sampled tokens), ``num_turns/mean``;
- ``off_policy/{mean,max}`` (age in policy versions of the batch's rollouts), ``off_policy/dropped`` (rollouts);
  ``off_policy/foreign_dropped``: rollouts dropped because an engine sampled them (in part) with another run's
  weights (also ``filter/dropped_{groups,rollouts}/foreign_policy``);
- ``filter/dropped_groups/<reason>``, ``filter/dropped_rollouts/<reason>``, ``filter/groups_offered``,
  ``filter/groups_kept``, ``filter/signal_groups``, ``filter/trimmed_rollouts``;
- distillation (``opd`` envs): ``teacher/<env>/kl`` (mean over the batch's scored tokens of the sampler's logprob
  minus the teacher's: the reverse-KL estimate at sampling time), ``teacher/<env>/tokens`` and
  ``teacher/scored_share`` (scored tokens / policy-sampled tokens of the batch); ``teacher/<env>/latency_s`` (mean
  seconds per scoring request) and ``teacher/<env>/requests`` since the last step;
- ``time/step``, ``time/wait_for_policy``, ``policy/served_version``;
- ``inference/retried_requests``: requests the policy client sent again since the last step (transient failures:
  a replica that left, an engine restart, a 5xx); with ``[deployment.elastic]`` also ``inference/replicas``
  (replica engines serving now), ``inference/replica_{joins,leaves}`` and ``inference/lost_requests`` (requests
  the replicas held when they left, so far; ``toolkit.orchestrator.replicas``);
- ``eval/<env>/{avg@k,pass@k}`` and ``eval/<env>/metric/<name>`` with ``/stderr``, ``eval/<env>/{errored,examples}``,
  ``eval/policy_version`` and ``time/eval`` on eval steps (see :mod:`toolkit.orchestrator.evaluation`).

Each step is written once across attempts: :class:`MetricsLog` reads the steps already recorded by the
orchestrator when it starts and refuses to write them again. The one exception is the eval of the final policy,
which comes after the last step's line: it is a line of its own at that step (:meth:`MetricsLog.write_eval`),
also written once.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

from toolkit.fsutil import append_jsonl
from toolkit.orchestrator.buffer import StepBatch
from toolkit.run.layout import RunDir
from toolkit.run.metrics import EVAL_POLICY_VERSION, ORCHESTRATOR, recorded_eval_steps, recorded_steps
from toolkit.run.types import Rollout

log = logging.getLogger(__name__)


def _stats(prefix: str, values: Sequence[float], out: dict[str, float]) -> None:
    if values:
        out[f"{prefix}/mean"] = sum(values) / len(values)
        out[f"{prefix}/max"] = max(values)
        out[f"{prefix}/min"] = min(values)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def seq_len(r: Rollout) -> int:
    """Tokens of all the rollout's training samples (prompt + completion, environment tokens included)."""
    return sum(len(s.prompt_ids) + len(s.completion_ids) for s in r.samples)


def step_metrics(batch: StepBatch) -> dict[str, float]:
    """Metrics of one assembled batch (names in the module docstring), without times and eval."""
    from toolkit.orchestrator.filtering import solve_rates

    out: dict[str, float] = {}
    _stats("reward/all", [r.reward for r in batch.scored], out)
    by_env: dict[str, list[Rollout]] = defaultdict(list)
    for r in batch.scored:
        by_env[r.env].append(r)
    for env, rs in sorted(by_env.items()):
        _stats(f"reward/{env}", [r.reward for r in rs], out)
        out[f"truncated_rollouts/{env}"] = float(sum(r.truncated for r in rs))
        seats = {r.seat for r in rs}
        if len(seats) > 1:  # a game's seats answer each other: one mean over both would hide who learns
            for seat in sorted(seats, key=str):
                _stats(f"reward/{env}/seat/{seat}", [r.reward for r in rs if r.seat == seat], out)
    out["solve_none"], out["solve_all"] = solve_rates(batch.group_rewards)
    out["effective_batch_size"] = float(len(batch.rollouts))
    for env, n in sorted(Counter(r.env for r in batch.rollouts).items()):
        out[f"batch/{env}/rollouts"] = float(n)
    out["errored_rollouts"] = float(sum(batch.errored.values()))
    for env, n in sorted(batch.errored.items()):
        out[f"errored_rollouts/{env}"] = float(n)
    for cls, n in sorted(batch.error_classes.items()):
        out[f"error/{cls}"] = float(n)
    out["rollouts_offered"] = float(len(batch.recorded))
    out["truncated_rollouts"] = float(sum(r.truncated for r in batch.scored))
    out["seq_len/mean"] = _mean([seq_len(r) for r in batch.rollouts])
    out["completion_len/mean"] = _mean([r.completion_len for r in batch.rollouts])
    out["num_turns/mean"] = _mean([r.num_turns for r in batch.rollouts])
    ages = batch.ages()
    out["off_policy/mean"] = _mean(ages)
    out["off_policy/max"] = float(max(ages, default=0))
    out["off_policy/dropped"] = float(batch.dropped_rollouts.get("off_policy", 0))
    out["off_policy/foreign_dropped"] = float(batch.dropped_rollouts.get("foreign_policy", 0))
    for reason, n in sorted(batch.dropped_groups.items()):
        out[f"filter/dropped_groups/{reason}"] = float(n)
        out[f"filter/dropped_rollouts/{reason}"] = float(batch.dropped_rollouts[reason])
    out["filter/groups_offered"] = float(batch.groups_offered)
    out["filter/groups_kept"] = float(batch.groups_kept)
    out["filter/signal_groups"] = float(batch.signal_groups)
    out["filter/trimmed_rollouts"] = float(batch.trimmed_rollouts)
    _teacher_metrics(batch.rollouts, out)
    return out


def _teacher_metrics(rollouts: Sequence[Rollout], out: dict[str, float]) -> None:
    """``teacher/<env>/{kl,tokens}`` and ``teacher/scored_share`` of the batch (module doc); nothing without a
    scored sample."""
    kl: dict[str, float] = defaultdict(float)
    scored: dict[str, int] = defaultdict(int)
    policy = 0
    for r in rollouts:
        for smp in r.samples:
            policy += sum(smp.completion_mask)
            if smp.ref_logprobs is None:
                continue
            for m, lp, ref in zip(smp.completion_mask, smp.completion_logprobs, smp.ref_logprobs, strict=True):
                if m:
                    kl[r.env] += lp - ref
                    scored[r.env] += 1
    for env in sorted(scored):
        out[f"teacher/{env}/kl"] = kl[env] / scored[env]
        out[f"teacher/{env}/tokens"] = float(scored[env])
    if scored:
        out["teacher/scored_share"] = sum(scored.values()) / max(policy, 1)


class MetricsLog:
    """Appends the orchestrator's per-step lines to ``run.metrics``, each step at most once across attempts.

    ``enabled`` false (``monitors.file = false``) writes nothing but still tracks steps.
    """

    def __init__(self, run: RunDir, *, enabled: bool = True) -> None:
        self.run = run
        self.enabled = enabled
        self.done = recorded_steps(run.metrics, ORCHESTRATOR)
        self.evals = recorded_eval_steps(run.metrics)
        self._end_torn_line()

    def _end_torn_line(self) -> None:
        # A writer killed mid-line leaves no newline at the end; our next line must not be glued onto it.
        try:
            with open(self.run.metrics, "rb") as f:
                f.seek(-1, 2)
                torn = f.read(1) != b"\n"
        except (FileNotFoundError, OSError):
            return
        if torn and self.enabled:
            with open(self.run.metrics, "ab") as f:
                f.write(b"\n")

    def has(self, step: int) -> bool:
        return step in self.done

    def write(self, step: int, metrics: dict[str, Any]) -> bool:
        """Append ``{"step", "time", "role", **metrics}``; returns False (and writes nothing) if the step is
        already recorded. Raises OSError on a failed write."""
        return self._append(step, metrics, seen=self.done, what="metrics")

    def has_eval(self, step: int) -> bool:
        """Whether a line of ``step`` already holds an eval (this attempt's or an earlier one's)."""
        return step in self.evals

    def write_eval(self, step: int, metrics: dict[str, Any]) -> bool:
        """Append an eval's line at ``step`` even when the step's own line exists (readers merge the lines of one
        role and step); returns False (and writes nothing) if an eval of that step is already recorded. Raises
        OSError on a failed write."""
        written = self._append(step, metrics, seen=self.evals, what="eval")
        if written:
            self.evals.add(step)
        return written

    def _append(self, step: int, metrics: dict[str, Any], *, seen: set[int], what: str) -> bool:
        """One orchestrator line at ``step`` unless ``step`` is in ``seen`` (then False, nothing written)."""
        if step in seen:
            log.info("%s of step %d already recorded by an earlier attempt; not written again", what, step)
            return False
        if self.enabled:
            self.run.root.mkdir(parents=True, exist_ok=True)
            append_jsonl(self.run.metrics, {"step": step, "time": time.time(), "role": ORCHESTRATOR, **metrics})
        self.done.add(step)
        if EVAL_POLICY_VERSION in metrics:
            self.evals.add(step)
        return True
