"""A supervisor's children and their descendants die with it, however it dies (real processes, no mocks).

The supervisor below starts children as the local launcher does (own session, kernel parent-death signal, group
registered with a ``GroupReaper``); each child starts a grandchild in its group, as vLLM starts its engine core
and torchrun its ranks. After ``kill -9`` of the supervisor nothing of the tree may be left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from toolkit.procutil import pid_alive, process_start_time

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl and /proc are Linux")

REPO = Path(__file__).resolve().parents[2]

SUPERVISOR = textwrap.dedent("""
    import subprocess, sys, time
    from toolkit.procutil import GroupReaper, kill_with_parent_preexec
    reaper = GroupReaper(grace_s=1.0)
    # A child that ignores SIGTERM and starts a grandchild that ignores it too: only SIGKILL ends them.
    code = ("import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "g = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
            "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)']); "
            "print(g.pid, flush=True); time.sleep(600)")
    pids = []
    for _ in range(2):
        p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                             start_new_session=True, preexec_fn=kill_with_parent_preexec())
        reaper.add(p.pid)
        pids += [p.pid, int(p.stdout.readline())]
    print(reaper.pid, *pids, flush=True)
    time.sleep(600)
""")


def _gone_within(pids: list[int], timeout_s: float) -> float:
    t0 = time.monotonic()
    while any(pid_alive(p) for p in pids):
        assert time.monotonic() - t0 < timeout_s, [p for p in pids if pid_alive(p)]
        time.sleep(0.05)
    return time.monotonic() - t0


def test_kill_9_of_the_supervisor_leaves_no_child_nor_grandchild():
    sup = subprocess.Popen(
        [sys.executable, "-c", SUPERVISOR],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    reaper, *tree = map(int, sup.stdout.readline().split())
    assert len(tree) == 4 and all(pid_alive(p) for p in tree)
    sup.send_signal(signal.SIGKILL)
    sup.wait()
    took = _gone_within([*tree, reaper], 10.0)
    print(f"tree of 4 gone {took:.2f} s after kill -9 of the supervisor")


def test_children_die_with_their_parent_even_without_a_reaper():
    code = (
        "import subprocess, sys, time; from toolkit.procutil import kill_with_parent_preexec; "
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], "
        "start_new_session=True, preexec_fn=kill_with_parent_preexec()); print(p.pid, flush=True); "
        "time.sleep(600)"
    )
    sup = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    child = int(sup.stdout.readline())
    sup.kill()
    sup.wait()
    _gone_within([child], 5.0)


def test_pid_alive_tells_a_reused_pid_from_the_process_it_names():
    me = os.getpid()
    assert pid_alive(me, process_start_time(me))
    assert not pid_alive(me, (process_start_time(me) or 0) + 1)
    p = subprocess.Popen(["true"])
    p.wait()
    assert not pid_alive(p.pid)
