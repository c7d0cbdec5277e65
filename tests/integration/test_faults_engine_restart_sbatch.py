"""The rendered rl.sbatch restarts a dead inference engine's job step (issue 9 item 2, Slurm side), with stub
``srun`` and probe components (see test_rl_sbatch_stubs.py): kill -9 of the engine is survived
``inference.max_restarts`` times, the next death ends the job naming the engine, and with ``max_restarts = 0`` the
first death does. Every probe is gone after teardown (the restart loop forwards the teardown's TERM)."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import test_rl_sbatch_stubs
from test_rl_sbatch_stubs import _alive, _start, _wait_records

stub_job = test_rl_sbatch_stubs.stub_job  # the fixture, shared

pytestmark = pytest.mark.slow


def _engine(run) -> dict:
    for p in (run.root / "probe").glob("*.json"):
        rec = json.loads(p.read_text())
        if rec["role"] == "inference":
            return rec
    raise AssertionError("no engine probe record")


def _kill_and_wait_restart(run, proc, timeout_s: float = 60) -> int:
    old = _engine(run)["pid"]
    os.kill(old, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            pid = _engine(run)["pid"]
        except (json.JSONDecodeError, OSError):
            pid = old  # the record is being replaced
        if pid != old:
            return pid
        assert proc.poll() is None, f"job ended instead of restarting the engine:\n{proc.communicate()[0]}"
        time.sleep(0.2)
    raise AssertionError("engine not restarted")


def test_engine_step_restarted_up_to_max_restarts_then_job_ends_naming_it(stub_job, tmp_path) -> None:
    run, script, env = stub_job("[inference]\nmax_restarts = 2\n", tmp_path / "out", trainer_seconds=300)
    proc = _start(script, env, tmp_path)
    _wait_records(run, 3, proc)
    name = _engine(run)["process"]
    pids = [_kill_and_wait_restart(run, proc) for _ in range(2)]
    os.kill(pids[-1], signal.SIGKILL)  # the third death: budget used
    t0 = time.monotonic()
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0, out
    assert f"{name} exited with status 137; restarting it (restart 1 of 2)" in out, out
    assert "(restart 2 of 2)" in out and f"{name} exited with status 137; restart budget used" in out, out
    assert f"teardown: {name} exited first" in out, out
    assert time.monotonic() - t0 < 60
    time.sleep(0.5)
    recs = [json.loads(p.read_text()) for p in (run.root / "probe").glob("*.json")]
    assert not any(_alive(r["pid"]) for r in recs), "components survived teardown"


def test_zero_max_restarts_ends_the_job_at_the_first_engine_death(stub_job, tmp_path) -> None:
    run, script, env = stub_job("[inference]\nmax_restarts = 0\n", tmp_path / "out", trainer_seconds=300)
    assert "srl_restarting" not in script.read_text()
    proc = _start(script, env, tmp_path)
    _wait_records(run, 3, proc)
    name = _engine(run)["process"]
    os.kill(_engine(run)["pid"], signal.SIGKILL)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0 and f"teardown: {name} exited first" in out, out
    assert "restarting it" not in out


def test_teardown_stops_a_restarted_engine(stub_job, tmp_path) -> None:
    run, script, env = stub_job("", tmp_path / "out", trainer_seconds=6)
    proc = _start(script, env, tmp_path)
    _wait_records(run, 3, proc)
    pid = _kill_and_wait_restart(run, proc)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out  # the trainer finished; the restarted engine was torn down with the rest
    time.sleep(0.5)
    assert not _alive(pid), "restarted engine survived teardown"
