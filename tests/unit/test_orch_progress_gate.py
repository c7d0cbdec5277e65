"""The orchestrator's progress record while its serving gate is closed (an engine down or restarting): it says it
waits for inference, so the supervisor's progress watchdog leaves the wait to the engine watch, and the phase it
was in comes back when the gate opens; the record lists the env workers' pids, so the watchdog asks them for their
stacks too (toolkit.orchestrator.main.Orchestrator._beat, on a real Heartbeat)."""

from __future__ import annotations

import asyncio
import os
from types import SimpleNamespace

from toolkit.orchestrator.main import Orchestrator
from toolkit.run import heartbeat
from toolkit.run.heartbeat import Heartbeat
from toolkit.run.layout import RunDir


async def _until(check, what: str, timeout_s: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not check():
        assert loop.time() < deadline, what
        await asyncio.sleep(0.05)


def test_a_closed_gate_reads_as_waiting_for_inference_and_the_phase_returns(tmp_path):
    run = RunDir(tmp_path / "run")
    hb = Heartbeat(run, "orchestrator")
    hb.phase("collecting the groups of step 4", step=4)
    client = SimpleNamespace(held=False)
    orch = SimpleNamespace(progress=hb, client=client, runtimes=[])

    def rec() -> dict:
        return heartbeat.read_all(run)["orchestrator"]

    async def go() -> None:
        beat = asyncio.create_task(Orchestrator._beat(orch))
        try:
            client.held = True
            await _until(lambda: rec()["waiting_for"] == "inference", "the record never said it waits for inference")
            assert rec()["phase"].endswith("during: collecting the groups of step 4") and rec()["step"] == 4
            # The main loop enters a new phase while the gate stays closed: the wait is said again over it.
            hb.phase("collecting the groups of step 5", step=5)
            await _until(lambda: rec()["waiting_for"] == "inference", "the new phase hid the wait for inference")
            client.held = False
            await _until(lambda: rec()["waiting_for"] is None, "the phase did not come back when the gate opened")
            assert rec()["phase"] == "collecting the groups of step 5" and rec()["step"] == 5
        finally:
            beat.cancel()

    asyncio.run(go())


def test_the_record_lists_the_env_workers_of_the_moment(tmp_path, monkeypatch):
    """The env workers' pids join the orchestrator's own in its record; a replaced worker's new pid follows."""
    monkeypatch.setattr(heartbeat, "BEAT_INTERVAL_S", 0.0)
    run = RunDir(tmp_path / "run")
    hb = Heartbeat(run, "orchestrator")
    workers = SimpleNamespace(pids=[4242, 4343])
    orch = SimpleNamespace(
        progress=hb, client=SimpleNamespace(held=False), runtimes=[workers, SimpleNamespace(pids=[])]
    )

    def pids() -> list[int]:
        return heartbeat.read_all(run).get("orchestrator", {}).get("pids", [])

    async def go() -> None:
        beat = asyncio.create_task(Orchestrator._beat(orch))
        try:
            await _until(lambda: pids() == [os.getpid(), 4242, 4343], "the workers' pids never reached the record")
            workers.pids = [4242, 4444]
            await _until(lambda: pids() == [os.getpid(), 4242, 4444], "the replacement's pid never reached the record")
        finally:
            beat.cancel()

    asyncio.run(go())
