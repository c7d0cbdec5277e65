"""kill -9 of the vLLM engine during a local run of the main job (issue 9 item 2, inference side).

The local launcher does not restart engines (see the issue note for why: a CPU engine restart takes minutes here,
the client's retry budget is seconds, and errored groups would count as empty steps and use up tasks), so a dead
engine ends the run at once, non-zero, naming the engine; ``--resume`` then continues without losing or repeating
a step.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_faults_local_resume import START_TIMEOUT_S, _finish, _start, _steps, _wait_trainer_step

pytestmark = [pytest.mark.slow, pytest.mark.heavy, pytest.mark.vllm, pytest.mark.timeout(2400)]
MAX_STEPS = 4


def _engine_pid(run: Path) -> tuple[str, int]:
    plan = json.loads((run / "launcher" / "placement.json").read_text())
    spec = next(p for p in plan["processes"] if p["role"] == "inference")
    port = str(spec["ports"]["http"])
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                argv = (d / "cmdline").read_bytes().decode().split("\0")
            except OSError:
                continue
            if "vllm.entrypoints.openai.api_server" in argv and argv[argv.index("--port") + 1] == port:
                return spec["name"], int(d.name)
    raise AssertionError("no engine process found")


def test_engine_kill_ends_run_naming_it_and_resume_loses_no_step(tmp_path, monkeypatch):
    import test_faults_local_resume as base

    monkeypatch.setattr(base, "MAX_STEPS", MAX_STEPS)
    out = tmp_path / "out"
    run = out / "faults"
    proc = _start(out, resume=False)
    _wait_trainer_step(proc, run, 1, START_TIMEOUT_S)
    time.sleep(random.Random(3).uniform(0.0, 3.0))
    name, pid = _engine_pid(run)
    os.kill(pid, signal.SIGKILL)
    t0 = time.monotonic()
    rc, text = _finish(proc, 120)
    took = time.monotonic() - t0
    assert rc != 0 and f"{name} exited with status -9" in text, text
    assert took < 60
    proc = _start(out, resume=True)
    rc, text = _finish(proc, START_TIMEOUT_S + 300)
    assert rc == 0, text
    for role in ("trainer", "orchestrator"):
        assert sorted(s for s in _steps(run, role) if s > 0) == list(range(1, MAX_STEPS + 1)), role
    print(f"\n[figure] engine kill -9 -> launcher exit in {took:.1f} s; resumed to step {MAX_STEPS}, 0 steps lost")
