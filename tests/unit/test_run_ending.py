"""How a run ended (``toolkit.run.ending``): the decision from what the roles and the supervisor know, its record,
and the exit status each ending maps to."""

from __future__ import annotations

import json

import pytest

from toolkit.orchestrator.stop import ZeroSignalGuard
from toolkit.run import ending
from toolkit.run.control import request_stop
from toolkit.run.layout import RunDir


@pytest.fixture
def run(tmp_path):
    r = RunDir(tmp_path / "run")
    r.control.mkdir(parents=True)
    with open(r.metrics, "w") as f:
        for step in (1, 2, 3):
            f.write(json.dumps({"role": "trainer", "step": step, "loss/mean": 0.1}) + "\n")
            f.write(json.dumps({"role": "orchestrator", "step": step + 1, "reward/all/mean": 1.0}) + "\n")
    return r


def test_reaching_max_steps_is_the_only_success(run):
    e = ending.settle(run)
    assert (e.cause, e.step, e.exit_status) == ("completed", 3, 0)
    assert ending.read(run) == e
    assert e.line() == "srl: run ended: reached max_steps (step 3) (exit status 0)"


def test_zero_signal_guard_stop_is_not_success_and_not_a_failure(run):
    guard = ZeroSignalGuard(2)
    reason = None
    for step in (4, 5):
        reason = guard.observe(step, groups_offered=4, groups_kept=4, signal_groups=0, dropped={})
    assert reason
    request_stop(run, reason)  # what the orchestrator does when the guard trips
    e = ending.settle(run)  # every process exited 0 afterwards
    assert e.cause == "no-signal" and e.criterion == "zero-signal guard" and e.role == "orchestrator"
    assert e.exit_status == 4  # README's table: the zero-signal guard is its own status
    assert "stopped by the zero-signal guard at step 3: zero-signal guard: 2 consecutive steps" in e.line()


def test_diverged_trainer_is_a_criterion_stop_even_though_it_exits_nonzero(run):
    request_stop(run, "loss or gradient not finite for 3 steps in a row", component="trainer")
    e = ending.settle(run, failed="trainer-0", failed_reason="exit status 1")
    assert (e.cause, e.criterion, e.role) == ("criterion", "divergence", "trainer")
    assert e.exit_status == 5


def test_other_criteria_and_the_first_recorded_one_wins(run):
    request_stop(run, "step 7: errored rollouts 90% > 50% for 3 steps")
    request_stop(run, "zero-signal guard: later")  # a second request keeps the first
    e = ending.settle(run)
    assert (e.cause, e.criterion) == ("criterion", "monitors.stop") and "errored rollouts" in e.reason


def test_a_role_failure_names_the_role_and_beats_another_roles_criterion(run):
    request_stop(run, "zero-signal guard: 10 consecutive steps")
    e = ending.settle(run, failed="inference-0", failed_reason="exit status 137 (log: x)")
    assert (e.cause, e.role, e.exit_status) == ("failed", "inference-0", 1)
    assert e.line().startswith("srl: run ended: failed in inference-0 at step 3: exit status 137")


def test_user_stop_time_limit_requeue_and_lease_loss(run):
    run.stop_request.touch()  # Ctrl-C or srl cancel: an empty stop request
    assert ending.settle(run).exit_status == 130
    assert ending.settle(run, user_stop=True).cause == "user"
    assert ending.settle(run, time_limit=True).exit_status == 6
    assert ending.settle(run, requeued=True).exit_status == 0
    ending.clear(run)
    lost = ending.settle(run, lease_lost=True)
    assert lost.exit_status == 3 and ending.read(run) is None  # the run is someone else's: nothing written


def test_statuses_are_distinct_per_cause():
    statuses = {c: ending.EXIT_STATUS[c] for c in ending.CAUSES if c != "preempted"}
    assert len(set(statuses.values())) == len(statuses)
    with pytest.raises(ValueError, match="unknown run ending cause"):
        ending.Ending("finished")


def test_batch_job_signals_map_to_user_stop_or_time_limit(run, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_END_TIME", "1")
    end = ending.settle_after_signal(run, "TERM")
    assert end.exit_status == 6 and "time limit" in end.line()
    monkeypatch.delenv("SLURM_JOB_END_TIME")
    assert ending.settle_after_signal(run, "USR2").exit_status == 6
    end = ending.settle_after_signal(run, "TERM")
    assert end.exit_status == 130 and "stopped by the user" in end.line()
    assert ending.settle_after_signal(run, None, requeued=True).exit_status == 0


def test_exit_statuses_are_exactly_readmes_table():
    """Each cause's status is the number README promises (scripts and ``afterok`` chains rely on them), and the
    table lists exactly those numbers plus 2 (bad config: nothing ran)."""
    import re
    from pathlib import Path

    want = {
        "completed": 0,
        "preempted": 0,
        "failed": 1,
        "lease-lost": 3,
        "no-signal": 4,
        "criterion": 5,
        "time-limit": 6,
        "stalled": 7,
        "user": 130,
    }
    assert ending.EXIT_STATUS == want
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    table = {int(n) for n in re.findall(r"^\| (\d+) \| ", readme, re.MULTILINE)}
    assert table == {0, 1, 2, 3, 4, 5, 6, 7, 130}, table
