"""A lease file whose fields have the wrong types (hand-edited, written by something else) reads as a holder that
expired long ago, as an unreadable one does: srl status and srl cancel name the run's state instead of dying with
a TypeError, and srl cancel never signals a PID it cannot confirm is the launcher."""

from __future__ import annotations

import json
import math
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from toolkit import lease as leases
from toolkit.launch.control import cancel_main, status_main
from toolkit.run.layout import RunDir

# On another host only the expiry decides whether the holder is alive.
GOOD = {
    "token": "t",
    "host": "elsewhere",
    "pid": 12345,
    "pid_start": 99,
    "job_id": None,
    "command": "srl rl",
    "acquired": 0.0,
    "renewed": 0.0,
    "expires": 9e99,
}


def _run(tmp_path: Path, record: dict | str) -> RunDir:
    run = RunDir(tmp_path / "run")
    run.configs.mkdir(parents=True)
    run.lease_file.parent.mkdir(parents=True, exist_ok=True)
    run.lease_file.write_text(record if isinstance(record, str) else json.dumps(record))
    return run


@pytest.mark.parametrize(
    "bad",
    [
        {"pid": "abc"},
        {"pid": True},
        {"pid": 1.5},
        {"expires": "x"},
        {"renewed": None},
        {"pid_start": "now"},
        {"host": 5},
        {"job_id": 7},
        {"command": ["srl"]},
    ],
    ids=lambda d: f"{next(iter(d))}={next(iter(d.values()))!r}",
)
def test_wrong_typed_record_reads_as_long_expired(tmp_path: Path, bad: dict, capsys) -> None:
    assert leases.read(_run(tmp_path / "good", GOOD)).dead_reason() is None  # the unchanged record is alive
    run = _run(tmp_path, {**GOOD, **bad})
    holder = leases.read(run)
    assert holder is not None and holder.dead_reason() is not None
    assert status_main([str(run.root)]) == 0
    assert cancel_main([str(run.root)]) == 1
    assert "no live local supervisor" in capsys.readouterr().err


def test_a_nan_expiry_is_not_a_live_holder(tmp_path: Path) -> None:
    run = _run(tmp_path, json.dumps({**GOOD, "expires": math.nan}))
    holder = leases.read(run)
    assert holder is not None and holder.dead_reason() is not None


def test_cancel_does_not_signal_a_pid_it_cannot_confirm(tmp_path: Path, capsys) -> None:
    """A live record on this host without the process's start time could name any process (PID 1, a reused PID):
    cancel refuses instead of sending SIGTERM to it."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        run = _run(tmp_path, {**GOOD, "host": socket.gethostname(), "pid": child.pid, "pid_start": None})
        assert cancel_main([str(run.root)]) == 1
        assert str(child.pid) in capsys.readouterr().err
        assert child.poll() is None, "srl cancel signalled a process it could not confirm was the launcher"
    finally:
        child.kill()
        child.wait()
