"""A torchrun worker dies with its agent (PR_SET_PDEATHSIG): no orphan trainer outlives a killed job step."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux-only")

# The "agent": starts a worker that asks for the death signal, prints the worker's pid, then sleeps.
AGENT = textwrap.dedent("""
    import os, subprocess, sys, time
    worker = subprocess.Popen([sys.executable, "-c", sys.argv[1]], env=dict(os.environ, TORCHELASTIC_RUN_ID="t"),
                              start_new_session=True)  # as torchrun starts its workers
    print(worker.pid, flush=True)
    time.sleep(600)
""")
WORKER = textwrap.dedent("""
    import sys, time
    from toolkit.trainer.dist import die_with_agent
    assert die_with_agent(), "death signal not set"
    print("armed", file=sys.stderr, flush=True)
    time.sleep(600)
""")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_worker_is_killed_when_its_agent_is_killed():
    agent = subprocess.Popen(
        [sys.executable, "-c", AGENT, WORKER],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=os.getcwd()),
    )
    worker = int(agent.stdout.readline())
    try:
        assert agent.stderr.readline().strip() == "armed"  # torch imported and prctl done
        assert _alive(worker)
        agent.send_signal(signal.SIGKILL)  # what Slurm does to the agent after KillWait
        agent.wait(10)
        deadline = time.monotonic() + 10
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(worker), "the worker outlived its agent"
    finally:
        if _alive(worker):
            os.kill(worker, signal.SIGKILL)
        if agent.poll() is None:
            agent.kill()


def test_outside_torchrun_nothing_is_set(monkeypatch):
    from toolkit.trainer.dist import die_with_agent

    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert die_with_agent() is False
