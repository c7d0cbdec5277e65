"""The orchestrator's progress record while its serving gate is closed (an engine down or restarting): it says it
waits for inference, so the supervisor's progress watchdog leaves the wait to the engine watch, and the phase it
was in comes back when the gate opens (toolkit.orchestrator.main.Orchestrator._beat, on a real Heartbeat)."""

from __future__ import annotations

import asyncio
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
    orch = SimpleNamespace(progress=hb, client=client)

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
