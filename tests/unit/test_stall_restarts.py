"""A stall in a Slurm batch job with ``slurm.requeue`` first requeues the job, ``monitors.stall_restarts`` times per
job (``launcher/stall_restarts.jsonl``), and the ending says it was a stall that requeued, not a preemption.

The whole path on the real local Slurm cluster: tests/integration/test_faults_stalled_slurm.py.
"""

from __future__ import annotations

import json

import pytest

from toolkit.config.model import MonitorsConfig
from toolkit.launch import watchdog
from toolkit.launch.supervisor import _stall_restart
from toolkit.run import ending
from toolkit.run.layout import RunDir


def _stall() -> watchdog.Stall:
    return watchdog.Stall("trainer.rank0", "trainer", {"step": 5, "phase": "train step 5"}, 40.0, 30.0, hung=True)


def _run(tmp_path) -> RunDir:
    run = RunDir(tmp_path / "run")
    run.launcher.mkdir(parents=True)
    return run


def test_each_job_gets_its_own_budget_of_stall_restarts(tmp_path):
    run = _run(tmp_path)
    job7 = {"SLURM_JOB_ID": "7"}
    first = _stall_restart(run, 1, _stall(), job7)
    assert first is not None and first.startswith("trainer made no progress for 40 s at step 5")
    assert "stall restart 1 of 1, monitors.stall_restarts" in first
    assert _stall_restart(run, 1, _stall(), job7) is None  # the requeued job's next stall ends the run
    # A later --resume is a new job: its own budget.
    assert _stall_restart(run, 1, _stall(), {"SLURM_JOB_ID": "9"}) is not None
    rows = [json.loads(x) for x in run.stall_restarts.read_text().splitlines()]
    assert [(r["job"], r["role"]) for r in rows] == [("7", "trainer"), ("9", "trainer")]


def test_two_allowed_and_none_allowed(tmp_path):
    run = _run(tmp_path)
    env = {"SLURM_JOB_ID": "3"}
    assert "stall restart 1 of 2" in _stall_restart(run, 2, _stall(), env)
    assert "stall restart 2 of 2" in _stall_restart(run, 2, _stall(), env)
    assert _stall_restart(run, 2, _stall(), env) is None
    assert _stall_restart(_run(tmp_path / "b"), 0, _stall(), env) is None
    assert not (tmp_path / "b" / "run" / "launcher" / "stall_restarts.jsonl").exists()


def test_torn_or_foreign_lines_do_not_count(tmp_path):
    run = _run(tmp_path)
    run.stall_restarts.write_text('{"job": "3"\nnot json\n[1, 2]\n{"job": "4"}\n')
    assert _stall_restart(run, 1, _stall(), {"SLURM_JOB_ID": "3"}) is not None


def test_the_ending_says_a_stall_requeued_the_job(tmp_path):
    run = _run(tmp_path)
    end = ending.settle(
        run, requeued=True, requeued_reason="trainer made no progress ...; every role restarts", stalled="trainer"
    )
    assert (end.cause, end.role, end.exit_status) == (ending.PREEMPTED, "trainer", 0)
    assert end.line().startswith("srl: run ended: stalled; requeued: trainer made no progress")
    assert ending.read(run) == end
    plain = ending.settle(_run(tmp_path / "p"), requeued=True)
    assert plain.summary().startswith("preempted; requeued: the job's pre-timeout signal came")


def test_stall_restarts_knob():
    assert MonitorsConfig().stall_restarts == 1
    with pytest.raises(ValueError, match="stall_restarts"):
        MonitorsConfig(stall_restarts=-1)
