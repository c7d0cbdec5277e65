"""Held-out eval metrics: standard errors over tasks, fixed draws per task, and the final eval's metrics line."""

from __future__ import annotations

import math
import statistics

import pytest

from toolkit.orchestrator.evaluation import EvalEnv, eval_metrics, mean_and_stderr, task_seed
from toolkit.orchestrator.records import MetricsLog
from toolkit.run.layout import RunDir
from toolkit.run.metrics import EVAL_POLICY_VERSION, is_eval_score, recorded_eval_steps, records
from toolkit.run.types import Rollout, SamplingParams


def _r(reward: float, error: str | None = None) -> Rollout:
    return Rollout(env="e", task_id="t", example_id=0, reward=reward, error_class=error)


def test_stderr_is_that_of_the_mean_over_task_means():
    groups = [
        [_r(1.0), _r(0.0), _r(1.0), _r(1.0)],
        [_r(0.5), _r(0.0), _r(0.0), _r(0.5)],
        [_r(0.2), _r(0.2), _r(0.2), _r(0.2)],
    ]
    m = eval_metrics("e", groups, 4)
    task_means = [0.75, 0.25, 0.2]
    assert m["eval/e/avg@4"] == pytest.approx(statistics.mean(task_means))
    assert m["eval/e/avg@4/stderr"] == pytest.approx(statistics.stdev(task_means) / math.sqrt(3))
    assert m["eval/e/pass@4"] == pytest.approx(1 / 3)
    assert m["eval/e/pass@4/stderr"] == pytest.approx(statistics.stdev([1, 0, 0]) / math.sqrt(3))
    assert all(is_eval_score(k) == (k in ("eval/e/avg@4", "eval/e/pass@4")) for k in m)


def test_errored_rollouts_leave_their_task_out_and_one_task_has_no_stderr():
    m = eval_metrics("e", [[_r(0.4), _r(0.0, "ProviderError")], [_r(0.0, "TaskError")] * 2], 2)
    assert m["eval/e/avg@2"] == pytest.approx(0.4) and m["eval/e/errored"] == 3 and m["eval/e/examples"] == 2
    assert "eval/e/avg@2/stderr" not in m and "eval/e/pass@2/stderr" not in m  # one valid task: no estimate
    assert mean_and_stderr([]) == (0.0, None)


def test_the_tasksets_own_metrics_are_means_over_tasks_with_their_stderr():
    def r(calls: float, error: str | None = None) -> Rollout:
        return Rollout(env="e", task_id="t", example_id=0, reward=0.0, metrics={"calls": calls}, error_class=error)

    m = eval_metrics("e", [[r(1.0), r(0.0)], [r(1.0), r(1.0)], [r(0.0), r(5.0, "HarnessError")]], 2)
    assert m["eval/e/metric/calls"] == pytest.approx(statistics.mean([0.5, 1.0, 0.0]))
    assert m["eval/e/metric/calls/stderr"] == pytest.approx(statistics.stdev([0.5, 1.0, 0.0]) / math.sqrt(3))
    assert not is_eval_score("eval/e/metric/calls")


def test_equal_task_scores_have_zero_stderr():
    m = eval_metrics("e", [[_r(1.0)] * 4 for _ in range(5)], 4)
    assert m["eval/e/avg@4"] == 1.0 and m["eval/e/avg@4/stderr"] == 0.0


def test_task_seeds_are_distinct_per_rollout_and_fixed_across_points():
    k = 4
    seeds = {task_seed(7, ex, k) + j for ex in range(100) for j in range(k)}
    assert len(seeds) == 400  # no two rollouts of one eval share a draw
    assert task_seed(7, 3, k) == task_seed(7, 3, k) == 7 + 12
    near_max = task_seed(2**63 - 1, 99, k) + k - 1
    assert 0 <= near_max < 2**63  # within vLLM's int64 seed
    assert EvalEnv("e", None, 1, k, SamplingParams()).seed is None  # engine randomness unless configured


def test_final_eval_is_its_own_line_at_a_recorded_step(tmp_path):
    run = RunDir(tmp_path / "run")
    log = MetricsLog(run)
    assert log.write(3, {"reward/all/mean": 0.5})
    assert not log.has_eval(3)
    assert log.write_eval(3, {"eval/e/avg@4": 0.7, EVAL_POLICY_VERSION: 3.0})
    assert not log.write_eval(3, {"eval/e/avg@4": 0.8, EVAL_POLICY_VERSION: 3.0})  # once per step
    # A later attempt sees both the step and its eval as recorded.
    again = MetricsLog(run)
    assert again.has(3) and again.has_eval(3) and recorded_eval_steps(run.metrics) == {3}
    assert not again.write_eval(3, {"eval/e/avg@4": 0.9, EVAL_POLICY_VERSION: 3.0})
    assert [r.get("eval/e/avg@4") for r in records(run.metrics)] == [None, 0.7]
    # A periodic eval written with the step's own line counts as that step's eval.
    assert log.write(4, {"eval/e/avg@4": 0.75, EVAL_POLICY_VERSION: 3.0}) and log.has_eval(4)


class _Runtime:
    """An env runtime that answers each group at once with rewards 1.0 for even examples, 0.0 for odd ones."""

    def example_ids(self, n: int) -> list[int]:
        return list(range(n))

    async def run_group(self, example: int, k: int, *, client, sampling) -> list[Rollout]:
        return [Rollout(env="e", task_id=str(example), example_id=example, reward=float(example % 2 == 0))] * k


def test_each_finished_eval_group_is_reported_as_progress():
    # The orchestrator counts each group as progress: the supervisor keeps a final eval that progresses running
    # past the checkpoint grace, and its watchdog does not take a long eval for a stall.
    import asyncio

    from toolkit.orchestrator.evaluation import run_eval

    done: list[int] = []
    envs = [EvalEnv("e", _Runtime(), num_examples=6, group_size=2, sampling=SamplingParams(), seed=3)]
    metrics, rollouts = asyncio.run(run_eval(envs, None, max_concurrent=4, on_group=lambda: done.append(1)))
    assert len(done) == 6 and len(rollouts) == 12 and metrics["eval/e/avg@2"] == pytest.approx(0.5)
