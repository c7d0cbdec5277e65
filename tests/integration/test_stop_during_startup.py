"""Ctrl-C while the engines are still starting stops the run within seconds, not after the start-up timeout.

Before this was handled, the orchestrator waited for the readiness file (which the launcher never writes once a stop
is requested) for the whole ``inference.startup_timeout_s`` plus a minute, so the launcher sat out its checkpoint
grace period (300 s) before giving up. Now every role watches the stop request while it waits.
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

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]


def _run_processes(run: Path) -> list[int]:
    """PIDs whose command line names this run directory (the launcher's children and their workers)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                if str(run) in (d / "cmdline").read_bytes().decode(errors="replace"):
                    out.append(int(d.name))
            except OSError:
                continue
    return out


def test_ctrl_c_during_engine_start_up_stops_promptly(tmp_path):
    run = tmp_path / "startup-stop"
    cmd = [
        sys.executable,
        "-m",
        "toolkit.cli",
        "rl",
        "@",
        str(REPO / "jobs/reverse-text/rl.toml"),
        "--output-dir",
        str(tmp_path),
        "--run.name",
        "startup-stop",
    ]
    with open(tmp_path / "out.log", "wb") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        # Wait until the roles are up and the engine is starting (its log exists), but before it is ready.
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not list((run / "logs").glob("attempt_1/inference*.log")):
            assert proc.poll() is None, (tmp_path / "out.log").read_text()
            time.sleep(0.5)
        time.sleep(5)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=300)
        took = time.monotonic() - t0
    text = (tmp_path / "out.log").read_text()
    print(f"\n[figure] stop during engine start-up took {took:.1f} s (rc {rc})")
    assert rc in (0, 130), text[-3000:]
    assert took < 120, text[-3000:]  # was > 300 s (checkpoint grace) before the fix
    # The launcher has killed them; a killed vLLM process can take seconds to vanish on a loaded machine, one the
    # launcher left behind stays.
    deadline = time.monotonic() + 60
    while _run_processes(run) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _run_processes(run) == [], "processes of the run outlived the launcher by more than 60 s"
    run_id = json.loads((run / "run_meta.json").read_text())["run_id"]
    # Local JIT caches live in the one per-user directory that persists between runs; nothing per attempt.
    assert not [p for p in Path("/tmp").iterdir() if run_id in p.name], "the attempt left a directory in /tmp"
