"""Hung roles of the main job run locally (issue 32): real vLLM on CPU, env workers, orchestrator and trainer under
the local launcher, ``monitors.stall_timeout_s = 30``. A role is stopped with SIGSTOP after trainer step 2, which is
how a rank deadlocked in a collective (or any hung process) looks from outside: no output, no exit.

- A stopped trainer or orchestrator: the supervisor's watchdog ends the run within the bound plus its stop
  sequence, with exit status 7, an ending that names the stopped role and the step and phase it was in, and its
  stopped state (``T``, it cannot dump its stacks) in the attempt's ``watchdog.log``. The other role, which waits
  on it and keeps beating, is not the one blamed.
- A stopped engine: it stops answering /health; the watchdog kills it and it is restarted like a dead engine; the
  orchestrator, which waits for inference meanwhile, is not blamed, and the run completes every step once.

Heavy (one CPU vLLM start-up each, a few minutes): run by hand, under the heavy lock. On the local Slurm cluster:
test_faults_stalled_slurm.py (CI).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_records import processes_of, role_steps
from test_faults_local_resume import REPO, START_TIMEOUT_S, _finish, _role_pid, _wait_trainer_step

pytestmark = [pytest.mark.slow, pytest.mark.heavy, pytest.mark.vllm, pytest.mark.timeout(2400)]
STALL_S = 30
GRACE_S = 30
# What may pass between the stop and the launcher's exit: the bound, one check, the stack wait, the others'
# checkpoint grace and the TERM-to-KILL wait, with room for a loaded 2-core machine.
END_WITHIN_S = STALL_S + GRACE_S + 15 + 120


def _start(out: Path, max_steps: int) -> subprocess.Popen:
    argv = [
        sys.executable,
        "-m",
        "toolkit.cli",
        "rl",
        "@",
        str(REPO / "jobs/reverse-text/rl.toml"),
        "--max-steps",
        str(max_steps),
        "--output-dir",
        str(out),
        "--run.name",
        "stall",
        "--monitors.stall-timeout-s",
        str(STALL_S),
        "--slurm.checkpoint-grace-s",
        str(GRACE_S),
    ]
    return subprocess.Popen(
        argv,
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _gone(pid: int) -> bool:
    return not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split(")")[1][:3]


@pytest.mark.parametrize(("role", "waiting"), [("trainer", "orchestrator"), ("orchestrator", "trainer")])
def test_a_stopped_role_ends_the_run_naming_it_within_the_bound(tmp_path, role, waiting):
    out = tmp_path / "out"
    run = out / "stall"
    proc = _start(out, 40)
    try:
        _wait_trainer_step(proc, run, 2, START_TIMEOUT_S)
        stopped = _role_pid(run, role)
        os.kill(stopped, signal.SIGSTOP)
        t0 = time.monotonic()
        rc, text = _finish(proc, END_WITHIN_S + 300)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert rc == 7, text[-4000:]
    assert took < END_WITHIN_S, f"the run took {took:.0f} s to end after the {role} stopped:\n{text[-4000:]}"
    end = json.loads((run / "ending.json").read_text())
    assert (end["cause"], end["role"]) == ("stalled", role), end
    assert end["reason"].startswith(f"{role} made no progress for "), end
    assert " at step " in end["reason"] and "(phase: " in end["reason"], end
    assert "run ended: stopped by the progress watchdog" in text and f"{role} made no progress" in text, text[-4000:]
    report = (run / "logs" / "attempt_1" / "watchdog.log").read_text()
    assert f"pid {stopped}" in report and "stopped (state T)" in report, report
    assert f"{waiting} made no progress" not in report, report
    assert _gone(stopped)  # killed, not left behind
    print(
        f"\n[figure] {role} SIGSTOP -> run ended (exit 7) after {took:.1f} s (stall bound {STALL_S} s, grace "
        f"{GRACE_S} s); {end['reason']}"
    )


def _engine_pid(run: Path) -> int:
    """The run's vLLM API server (the launcher's inference child), found by its command line."""
    pids = [int(line.split(":", 1)[0]) for line in processes_of(run) if "vllm.entrypoints.openai.api_server" in line]
    assert pids, processes_of(run)
    return min(pids)  # the API server starts before its engine-core processes


def test_a_stopped_engine_is_restarted_and_the_run_completes(tmp_path):
    out = tmp_path / "out"
    run = out / "stall"
    steps = 30  # the engine is stopped while most steps remain, however fast the first ones went
    proc = _start(out, steps)
    try:
        _wait_trainer_step(proc, run, 2, START_TIMEOUT_S)
        engine = _engine_pid(run)
        os.kill(engine, signal.SIGSTOP)
        t0 = time.monotonic()
        rc, text = _finish(proc, START_TIMEOUT_S + END_WITHIN_S + 300)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert rc == 0, text[-4000:]
    assert "did not answer /health for" in text and "to restart it" in text, text[-4000:]
    assert "made no progress" not in text, text[-4000:]  # the orchestrator waited for inference: not a stall
    end = json.loads((run / "ending.json").read_text())
    assert end["cause"] == "completed", end
    for r in ("trainer", "orchestrator"):
        assert sorted(role_steps(run, r, first=1)) == list(range(1, steps + 1)), r
    assert _gone(engine)
    print(
        f"\n[figure] engine SIGSTOP -> killed, restarted, run completed {steps} steps {took:.1f} s later "
        f"(stall bound {STALL_S} s)"
    )
