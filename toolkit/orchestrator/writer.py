"""The orchestrator's run-directory writes (rollout store appends, training batches) in a child process.

Why a process and not a thread: h5py and the batch write hold the GIL while they work (about 30 ms per 64-rollout
append alone, more under contention), and the orchestrator's event loop is CPU-bound at high rollout rates. In a
thread those writes took about a third of the loop's time in ``tests/benchmarks/orchestrator_overhead.py``; in a
process they run on another core and the loop only pickles the step's rollouts.

One worker process, so writes happen in submission order (a step's store rows, then its batch, then the next
step's). Errors raised in the child (``OSError`` such as ENOSPC, ``ValueError`` for a malformed batch) are raised
again in the caller; a child that dies (killed, out of memory) raises ``RecordWriterDied``. The child is started on
first use with the ``spawn`` method (the orchestrator has running threads: forking it is unsafe), ignores SIGTERM
and SIGINT (a stopping orchestrator still writes its last batch through it) and is killed by the kernel if the
orchestrator dies (``procutil.die_with_parent``), so it never outlives its run.
"""

from __future__ import annotations

import asyncio
import multiprocessing
from collections.abc import Sequence
from concurrent.futures import BrokenExecutor, ProcessPoolExecutor
from pathlib import Path
from typing import Any

from toolkit.run.layout import RunDir
from toolkit.run.types import Rollout, TrainingSample

# One store writer per path in the child process (the store's schema check happens once, at the first append).
_STORES: dict[str, Any] = {}


class RecordWriterDied(RuntimeError):
    """The record writer process exited before finishing a write (the write may be partial; the store and the
    batch format tolerate that: uncommitted rows and unmarked batch directories are ignored by readers)."""


def _child_init() -> None:
    import signal

    from toolkit.procutil import die_with_parent

    # Slurm's pre-timeout SIGTERM and a terminal's Ctrl-C reach every process of the job step or process group;
    # the writer must live on to write the batch and state the stopping orchestrator still sends it. Its lifetime
    # is the orchestrator's: ``close()``, or SIGKILL from the kernel when the orchestrator is gone.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent()
    # The writing modules load now, once, and with everything else imported so far leave the collector's view: each
    # step's unpickled rollouts trigger collections that would otherwise walk them every time (-10% CPU per step).
    import gc

    import toolkit.batches
    import toolkit.run.store  # noqa: F401

    gc.collect()
    gc.freeze()


def _store_append(store_path: str, rollouts: list[Rollout], step: int, kind: str, ages: list[int] | None) -> None:
    from toolkit.run.store import RolloutStoreWriter

    writer = _STORES.get(store_path)
    if writer is None:
        writer = _STORES[store_path] = RolloutStoreWriter(Path(store_path))
    writer.append(rollouts, step=step, kind=kind, off_policy_age=ages)


def _persist_step(
    run_root: str,
    step: int,
    recorded: list[Rollout],
    ages: list[int],
    training: tuple[list[TrainingSample], list[float], list[int], list[str]],
    meta: dict[str, Any],
) -> None:
    from toolkit import batches

    run = RunDir(run_root)
    if recorded:
        _store_append(str(run.rollout_store), recorded, step, "train", ages)
    samples, advantages, versions, envs = training
    batches.write_batch(run, step, samples, advantages, policy_versions=versions, envs=envs, meta=meta)


class RecordWriter:
    """Writes a run's store rows and training batches from a child process. Use from one event loop.

    ``persist_step`` and ``append_store`` return when the data is on the filesystem (the metrics line of a step
    must never precede its batch). ``close()`` waits for pending writes and stops the child.
    """

    def __init__(self, run_root: Path) -> None:
        self.run_root = Path(run_root)
        self._pool: ProcessPoolExecutor | None = None

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                max_workers=1, mp_context=multiprocessing.get_context("spawn"), initializer=_child_init
            )
        return self._pool

    async def _run(self, fn: Any, *args: Any) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor(), fn, *args)
        except BrokenExecutor as exc:
            self._pool = None  # the next write starts a fresh child
            raise RecordWriterDied(f"the record writer process for {self.run_root} died: {exc}") from exc

    async def persist_step(
        self,
        step: int,
        recorded: Sequence[Rollout],
        ages: Sequence[int],
        training: tuple[list[TrainingSample], list[float], list[int], list[str]],
        meta: dict[str, Any],
    ) -> None:
        """Append ``recorded`` (with off-policy ``ages``) to the store as ``train`` rows of ``step``, then write the
        step's training batch (``training`` = samples, advantages, policy versions, env names; see
        ``batches.write_batch``) with ``meta``."""
        await self._run(_persist_step, str(self.run_root), step, list(recorded), list(ages), training, meta)

    async def append_store(
        self, rollouts: Sequence[Rollout], *, step: int, kind: str, ages: Sequence[int] | None
    ) -> None:
        """Append ``rollouts`` to the run's store as rows of ``step`` labelled ``kind`` ("train"/"eval")."""
        if rollouts:
            store = str(RunDir(self.run_root).rollout_store)
            await self._run(_store_append, store, list(rollouts), step, kind, None if ages is None else list(ages))

    def close(self) -> None:
        """Wait for pending writes and stop the child (idempotent)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
