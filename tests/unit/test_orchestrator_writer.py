"""The orchestrator's record writer process: what it writes, how its failures surface, and that it dies with the
orchestrator (a real child process; the store and batch are read back with the readers the trainer and reports
use)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from toolkit.batches import load_batch_dir
from toolkit.orchestrator.writer import RecordWriter, RecordWriterDied
from toolkit.run.layout import RunDir
from toolkit.run.store import load_rollouts
from toolkit.run.types import Rollout, TrainingSample


def _rollout(i: int, *, reward: float = 0.5) -> Rollout:
    sample = TrainingSample([5, 6, 7], [8, 9], [-0.25, -0.5], [True, True])
    return Rollout(
        env="rev",
        task_id=f"t{i}",
        example_id=i,
        samples=[sample],
        reward=reward,
        num_turns=1,
        policy_version=1,
        group_id=i // 2,
        advantage=reward - 0.5,
    )


def _child_pid(writer: RecordWriter) -> int | None:
    """Process id of the writer process, None before the first write (or after it died or was closed)."""
    processes = getattr(writer._pool, "_processes", None) or {}
    return next(iter(processes), None)


def _training(rollouts: list[Rollout]) -> tuple:
    samples = [r.samples[0] for r in rollouts]
    return samples, [r.advantage for r in rollouts], [r.policy_version for r in rollouts], [r.env for r in rollouts]


@pytest.fixture
def run(tmp_path: Path) -> RunDir:
    return RunDir(tmp_path / "run")


@pytest.fixture
def writer(run: RunDir) -> Iterator[RecordWriter]:
    w = RecordWriter(run.root)
    yield w
    w.close()


def test_writes_store_rows_then_the_batch_in_order(run: RunDir, writer: RecordWriter) -> None:
    async def go() -> None:
        for step in (1, 2):
            rollouts = [_rollout(i, reward=float(i % 2)) for i in range(4)]
            await writer.persist_step(step, rollouts, [step - 1] * 4, _training(rollouts), {"step": step})
            # Returned: both are on disk now (the metrics line that follows must never precede the batch).
            assert (run.rollout_step(step) / "READY").is_file()
        await writer.append_store([_rollout(9)], step=2, kind="eval", ages=[0])

    asyncio.run(go())
    df = load_rollouts(run.rollout_store)
    assert list(df["step"]) == [1] * 4 + [2] * 4 + [2]
    assert list(df["kind"].astype(str)) == ["train"] * 8 + ["eval"]
    assert list(df["off_policy_age"])[:8] == [0] * 4 + [1] * 4
    batch = load_batch_dir(run.rollout_step(2))
    assert batch.num_samples == 4 and batch.meta == {"step": 2}


def test_filesystem_error_in_the_child_is_raised_in_the_caller(run: RunDir, writer: RecordWriter) -> None:
    run.root.write_text("a file where the run directory should be")
    with pytest.raises(OSError):
        asyncio.run(writer.append_store([_rollout(0)], step=1, kind="train", ages=None))


def test_a_killed_writer_is_reported_and_replaced(run: RunDir, writer: RecordWriter) -> None:
    async def go() -> None:
        await writer.append_store([_rollout(0)], step=1, kind="train", ages=None)
        os.kill(_child_pid(writer), 9)
        with pytest.raises(RecordWriterDied, match="died"):
            await writer.append_store([_rollout(1)], step=2, kind="train", ages=None)
        await writer.append_store([_rollout(2)], step=3, kind="train", ages=None)  # a fresh child

    asyncio.run(go())
    assert list(load_rollouts(run.rollout_store)["step"]) == [1, 3]


def test_the_writer_outlives_a_stop_signal_sent_to_the_whole_job(run: RunDir, writer: RecordWriter) -> None:
    # Slurm signals every process of the step before the time limit; the orchestrator then writes its last batch.
    async def go() -> None:
        await writer.append_store([_rollout(0)], step=1, kind="train", ages=None)
        pid = _child_pid(writer)
        os.kill(pid, signal.SIGTERM)
        os.kill(pid, signal.SIGINT)
        await asyncio.sleep(0.2)
        await writer.append_store([_rollout(1)], step=2, kind="train", ages=None)
        assert _child_pid(writer) == pid

    asyncio.run(go())
    assert list(load_rollouts(run.rollout_store)["step"]) == [1, 2]


def test_the_writer_dies_with_the_orchestrator(tmp_path: Path) -> None:
    # The orchestrator (here a small parent process) is SIGKILLed: its writer must not live on as an orphan.
    script = f"""
import asyncio, os, sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from test_orchestrator_writer import _child_pid, _rollout
from toolkit.orchestrator.writer import RecordWriter
w = RecordWriter({str(tmp_path / "run")!r})
asyncio.run(w.append_store([_rollout(0)], step=1, kind="train", ages=None))
print(_child_pid(w), flush=True)
os.kill(os.getpid(), 9)
"""
    # check=False: the parent ends by SIGKILL on purpose
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    child = int(proc.stdout.split()[0])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(child, 9)
    pytest.fail(f"record writer {child} outlived its orchestrator")
