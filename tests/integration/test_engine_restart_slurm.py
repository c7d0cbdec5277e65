"""A dead inference engine's job step, restarted by the batch job's supervisor under real ``srun`` on the local Slurm
cluster, is health-checked before it serves, exactly as in a local run (toolkit/launch/supervisor.py).

Every component is the probe (probe/probe.py); a restarted engine probe waits ``probe/engine_restart_delay_s``
before it answers /health. The engine's process inside its job step is killed with SIGKILL, so srun reports the
step's death as Slurm does for a crashed engine.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import test_rl_sbatch_slurm
from test_rl_sbatch_slurm import UNTIL_STOPPED_S, WAIT_S, _batch_log, _wait_log, _wait_records

from toolkit.launch import slurm
from toolkit.launch.submit import submit_job

probe_run = test_rl_sbatch_slurm.probe_run  # the fixture, shared

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

ENGINE = "inference-0-0"


def _engine_pid(run) -> int:
    rec = next(p for p in (run.root / "probe").glob(f"{ENGINE}@*#0.json"))
    return json.loads(rec.read_text())["pid"]


def _kill_engine(run, timeout_s: float = WAIT_S) -> int:
    """SIGKILL the engine probe inside its job step; returns the pid of the engine that replaced it."""
    old = _engine_pid(run)
    os.kill(old, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            pid = _engine_pid(run)
        except (json.JSONDecodeError, OSError, StopIteration):
            pid = old  # the record is being replaced
        if pid != old:
            return pid
        time.sleep(0.2)
    raise AssertionError(f"engine not restarted:\n{_batch_log(run)}")


def test_restarted_engine_step_is_health_checked_then_the_budget_ends_the_job(probe_run):
    delay = 4.0
    # The trainer runs until stopped: only the engine's deaths can end this job.
    cfg, run, attempt = probe_run("restart3", trainer_seconds=UNTIL_STOPPED_S, tail="[inference]\nmax_restarts = 1\n")
    (run.root / "probe" / "engine_restart_delay_s").write_text(str(delay))
    job = submit_job(cfg, run, attempt)
    try:
        _wait_records(run, 6, WAIT_S)
        _wait_log(run, r"inference ready", WAIT_S)
        _kill_engine(run)
        _wait_log(run, rf"{ENGINE} exited with status \d+; restarting it \(restart 1 of 1", WAIT_S)
        # Healthy only once the restarted engine answers /health, which it does after `delay` seconds (the
        # supervisor's own measure, from its restart).
        took = float(_wait_log(run, rf"{ENGINE} healthy again ([0-9.]+) s after its restart", WAIT_S).group(1))
        assert took >= delay, _batch_log(run)
        assert slurm.job_state(job).state == "RUNNING"
        os.kill(_engine_pid(run), signal.SIGKILL)  # the second death: budget used
        st = slurm.wait(job, timeout_s=WAIT_S)
    finally:
        slurm.cancel(job)
    log = _batch_log(run)
    assert st.state == "FAILED" and st.exit_code not in (None, 0), (st, log)
    assert f"{ENGINE} exited with status" in log and "restart budget used (1 restart(s))" in log, log
    assert f"teardown: {ENGINE} exited first" in log, log


def test_restarted_engine_that_never_answers_health_ends_the_job(probe_run):
    # The engine's first start answers at once; its restart never does: after inference.startup_timeout_s the
    # supervisor ends the job instead of leaving the orchestrator a dead engine.
    cfg, run, attempt = probe_run(
        "restart4", trainer_seconds=UNTIL_STOPPED_S, tail="[inference]\nmax_restarts = 2\nstartup_timeout_s = 8\n"
    )
    (run.root / "probe" / "engine_restart_delay_s").write_text("100000")
    job = submit_job(cfg, run, attempt)
    try:
        _wait_records(run, 6, WAIT_S)
        _wait_log(run, r"inference ready", WAIT_S)
        t0 = time.monotonic()
        _kill_engine(run)
        _wait_log(run, rf"{ENGINE} exited with status \d+; restarting it \(restart 1 of 2", WAIT_S)
        restarted = time.monotonic()  # no earlier than the supervisor's record of the restart
        gave_up = _wait_log(run, rf"restarted {ENGINE} not healthy after (\d+) s; stopping the run", WAIT_S)
        ended = time.monotonic()
        st = slurm.wait(job, timeout_s=WAIT_S)
    finally:
        slurm.cancel(job)
    log = _batch_log(run)
    assert st.state == "FAILED", (st, log)
    assert "healthy again" not in log, log
    assert f"teardown: {ENGINE} exited first" in log, log
    # It waited the start-up timeout (8 s) from the restart: by the supervisor's own measure, and by the test's
    # clock from the kill, which comes before the restart and before the record is seen.
    assert int(gave_up.group(1)) >= 8 and ended - t0 >= 8, (gave_up.group(0), ended - t0)
    # ... and no longer: the restart record to the give-up record, both seen by polling, with a margin for a busy
    # machine; the default startup_timeout_s (900 s) could not end it this soon.
    assert ended - restarted < 120, ended - restarted
