"""A hung trainer ends the run (issue 32): the main job locally (real vLLM on CPU, env workers, orchestrator,
trainer under the local launcher) with ``monitors.stall_timeout_s = 30``; the trainer is stopped with SIGSTOP after
step 2, which is how a rank deadlocked in a collective looks from outside (no output, no exit).

The supervisor's watchdog must end the run within the bound plus its stop sequence, with exit status 7, an ending
that names the trainer and the step and phase it was in, and the trainer's stopped state (``T``, it cannot dump its
stacks) in the attempt's ``watchdog.log``. The orchestrator, which waits for the trainer's weights and keeps
beating, must not be the one blamed.

Heavy (one CPU vLLM start-up, a few minutes): run by hand, under the heavy lock.
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
from test_faults_local_resume import REPO, START_TIMEOUT_S, _finish, _role_pid, _wait_trainer_step

pytestmark = [pytest.mark.slow, pytest.mark.heavy, pytest.mark.vllm, pytest.mark.timeout(2400)]
STALL_S = 30
GRACE_S = 30
# What may pass between the stop and the launcher's exit: the bound, one check, the stack wait, the others'
# checkpoint grace and the TERM-to-KILL wait, with room for a loaded 2-core machine.
END_WITHIN_S = STALL_S + GRACE_S + 15 + 120


def test_a_stopped_trainer_ends_the_run_naming_it_within_the_bound(tmp_path):
    out = tmp_path / "out"
    run = out / "stall"
    argv = [sys.executable, "-m", "toolkit.cli", "rl", "@", str(REPO / "jobs/reverse-text/rl.toml"),
            "--max-steps", "40", "--output-dir", str(out), "--run.name", "stall",
            "--monitors.stall-timeout-s", str(STALL_S), "--slurm.checkpoint-grace-s", str(GRACE_S)]  # fmt: skip
    proc = subprocess.Popen(argv, cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip
    try:
        _wait_trainer_step(proc, run, 2, START_TIMEOUT_S)
        trainer = _role_pid(run, "trainer")
        os.kill(trainer, signal.SIGSTOP)
        t0 = time.monotonic()
        rc, text = _finish(proc, END_WITHIN_S + 300)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert rc == 7, text[-4000:]
    assert took < END_WITHIN_S, f"the run took {took:.0f} s to end after the trainer stopped:\n{text[-4000:]}"
    end = json.loads((run / "ending.json").read_text())
    assert (end["cause"], end["role"]) == ("stalled", "trainer"), end
    assert end["reason"].startswith("trainer made no progress for "), end
    assert " at step " in end["reason"] and "(phase: " in end["reason"], end
    assert "run ended: stopped by the progress watchdog" in text and "trainer made no progress" in text, text[-4000:]
    report = (run / "logs" / "attempt_1" / "watchdog.log").read_text()
    assert f"pid {trainer}" in report and "stopped (state T)" in report, report
    assert "orchestrator made no progress" not in report, report
    # The stopped trainer was killed, not left behind.
    assert not Path(f"/proc/{trainer}").exists() or "Z" in Path(f"/proc/{trainer}/stat").read_text().split(")")[1][:3]
    print(f"\n[figure] trainer SIGSTOP -> run ended (exit 7) after {took:.1f} s (stall bound {STALL_S} s, grace "
          f"{GRACE_S} s); {end['reason']}")  # fmt: skip
