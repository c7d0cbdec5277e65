"""Per-process progress records ``<run>/progress/<key>.json``: what each long-lived role is doing, read by the
supervisor's progress watchdog (:mod:`toolkit.launch.watchdog`).

``metrics.jsonl`` says which steps finished; it cannot say what a process is doing between two lines, or whether
it still answers. Each trainer rank and the orchestrator therefore keep one small JSON record, rewritten
atomically when their phase changes and, while they wait in a polling loop, at most every
:data:`BEAT_INTERVAL_S` seconds::

    {"role": "trainer", "key": "trainer.rank0", "pid": 4242, "host": "node1", "time": 1700000000.0,
     "beat": 17, "progress": 9, "step": 5, "phase": "train step 5", "waiting_for": null, "kind": "startup",
     "size_bytes": 0, "pids": [4242]}

- ``progress`` grows by one at every phase change (a new step, a new phase, a batch written, a group collected);
  the watchdog measures how long it stood still, with the supervisor's own clock (no clock agreement between
  hosts is needed);
- ``beat`` grows at every write: a process that waits in a polling loop keeps beating without progressing; a
  process that is stopped (``SIGSTOP``), deadlocked in a collective or stuck in a call stops beating;
- ``waiting_for``: the role this phase waits on (``orchestrator`` while the trainer waits for a batch, ``trainer``
  while the orchestrator waits for a newer policy), so the watchdog blames the role that is stuck, not the one
  waiting on it;
- ``kind``: a phase known to be long: :data:`STARTUP` (model load, the first step of an attempt: compilation),
  :data:`LONG` (an eval), :data:`WEIGHTS` (checkpoint write, weight broadcast or update; ``size_bytes`` is what the
  phase moves), which the watchdog's bound scales for (``monitors.stall_*``);
- ``pids``: processes of this role that answer :data:`STACK_DUMP_SIGNAL` with their Python stacks (the role
  itself and, for the orchestrator, its env workers).

Every role entry point calls :func:`enable_stack_dumps`: on :data:`STACK_DUMP_SIGNAL` the process writes every
thread's Python stack to its stderr (its log), from the signal handler itself, so a process blocked in C code or a
collective answers too. A stopped process cannot answer until it is continued.

Writing a record never raises (a full disk must not end a run the watchdog only observes); stdlib only.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from toolkit.fsutil import atomic_write_json, read_json
from toolkit.run.layout import RunDir

STACK_DUMP_SIGNAL = signal.SIGURG
"""The signal that makes a role dump its Python stacks. Not SIGUSR1 (NCCL's) nor SIGUSR2 (the trainer's
pre-timeout stop); SIGURG's default action is to be ignored, so a process that never registered (an engine's
worker, a tokenizer helper) is left untouched when its process group gets it."""
BEAT_INTERVAL_S = 5.0
"""At most one record write per this many seconds while nothing changes (waiting loops call :meth:`beat`
often)."""

STARTUP = "startup"
"""Phase kind: loading the model, building the optimizer, the attempt's first step (compilation)."""
LONG = "long"
"""Phase kind: another phase known to run long without intermediate progress (an eval); bounded like start-up."""
WEIGHTS = "weights"
"""Phase kind: writing a checkpoint, broadcasting or updating weights; scaled by ``size_bytes``."""
KINDS = (STARTUP, LONG, WEIGHTS)
FINISHED = "finished"
"""The phase a role enters last, once it will write nothing more to ``metrics.jsonl`` (see
:func:`wait_until_finished`)."""
SILENT_S = 60.0
"""A record not rewritten for this many seconds (of the reader's clock) belongs to a process that ended without
saying so, or that hangs (the watchdog's business): :func:`wait_until_finished` stops waiting for it. Twelve beat
intervals, because a loaded event loop can miss several beats."""


def enable_stack_dumps(file: Any = None) -> bool:
    """Make this process write every thread's Python stack to ``file`` (default: stderr, the role's log) when it
    gets :data:`STACK_DUMP_SIGNAL`. Returns False (and does nothing) where the stream has no file descriptor."""
    stream = sys.stderr if file is None else file
    try:
        faulthandler.register(STACK_DUMP_SIGNAL, file=stream, all_threads=True, chain=False)
    except (ValueError, OSError, AttributeError, RuntimeError):  # a replaced stderr without fileno()
        return False
    return True


def record_path(run: RunDir, key: str) -> Path:
    """The progress record of process ``key`` (``trainer.rank0``, ``orchestrator``)."""
    return run.progress / f"{key}.json"


def read_all(run: RunDir) -> dict[str, dict[str, Any]]:
    """Every readable progress record of ``run``, by key; damaged or half-written records are skipped."""
    out: dict[str, dict[str, Any]] = {}
    if not run.progress.is_dir():
        return out
    for p in sorted(run.progress.glob("*.json")):
        rec = read_json(p)
        if isinstance(rec, dict) and isinstance(rec.get("role"), str):
            out[p.stem] = rec
    return out


def clear(run: RunDir) -> None:
    """Remove every progress record (a new attempt starts: the previous one's processes are gone)."""
    if run.progress.is_dir():
        for p in run.progress.glob("*.json"):
            p.unlink(missing_ok=True)


def wait_until_finished(
    run: RunDir,
    key: str,
    *,
    should_stop: Any = lambda: False,
    on_wait: Any = lambda: None,
    silent_s: float = SILENT_S,
    poll_s: float = 0.5,
    clock: Any = time.monotonic,
) -> str:
    """Block until process ``key`` (``orchestrator``) has said it is done writing: its record's phase is
    :data:`FINISHED`. Why: a role that mirrors or summarises ``metrics.jsonl`` at its own end (the trainer's W&B
    mirror) must not end before the lines another role writes last (the orchestrator's eval of the final policy,
    written after the trainer's last step).

    Returns ``"finished"``; ``"silent"`` when the record (or its absence) has not changed for ``silent_s`` seconds
    of ``clock`` (a crashed or hung process: never waits forever; the host clocks need not agree, only changes of
    the record are compared); ``"stopped"`` when ``should_stop()`` turned true. ``on_wait`` is called at every poll
    (the caller's own :meth:`Heartbeat.beat`)."""
    path = record_path(run, key)
    seen: Any = object()
    changed_at = clock()
    while True:
        rec = read_json(path)
        if isinstance(rec, dict) and rec.get("phase") == FINISHED:
            return "finished"
        marker = (rec.get("beat"), rec.get("pid")) if isinstance(rec, dict) else None
        if marker != seen:
            seen, changed_at = marker, clock()
        elif clock() - changed_at >= silent_s:
            return "silent"
        if should_stop():
            return "stopped"
        on_wait()
        time.sleep(poll_s)


class Heartbeat:
    """The progress record of one process of ``role``; ``key`` defaults to the role (a trainer rank passes
    ``trainer.rank<N>``).

    :meth:`phase` starts a new phase (progress); :meth:`beat` says the process still runs (rate-limited to
    :data:`BEAT_INTERVAL_S`); :meth:`advance` counts progress within a phase (a group collected). ``clock`` is
    injectable for tests.
    """

    def __init__(self, run: RunDir, role: str, *, key: str | None = None, clock: Any = time.time) -> None:
        self.run, self.role, self.key, self.clock = run, role, key or role, clock
        self.path = record_path(run, self.key)
        self.pid, self.host = os.getpid(), socket.gethostname()
        self.extra_pids: list[int] = []
        self.step: int | None = None
        self.name = "starting"
        self.waiting_for: str | None = None
        self.kind: str | None = STARTUP
        self.size_bytes = 0
        self.progress = 0
        self.beats = 0
        self.written_at = float("-inf")
        self.failed = False  # the last write failed (full disk): said once in the log, retried at the next beat

    def phase(
        self,
        name: str,
        *,
        step: int | None = None,
        waiting_for: str | None = None,
        kind: str | None = None,
        size_bytes: int = 0,
    ) -> None:
        """Enter phase ``name`` (``train step 5``) of trainer ``step``; ``waiting_for``: the role it waits on;
        ``kind``: :data:`STARTUP` or :data:`WEIGHTS` for a phase known to be long (``size_bytes``: bytes it
        moves). Raises ValueError for an unknown kind."""
        if kind is not None and kind not in KINDS:
            raise ValueError(f"unknown phase kind {kind!r}; one of {', '.join(KINDS)}")
        self.name, self.waiting_for, self.kind, self.size_bytes = name, waiting_for, kind, int(size_bytes)
        if step is not None:
            self.step = step
        self.progress += 1
        self._write()

    def advance(self) -> None:
        """Count progress inside the current phase (a group collected, an episode finished)."""
        self.progress += 1
        self._write()

    def beat(self) -> None:
        """Say the process is alive (in a waiting loop); writes at most every :data:`BEAT_INTERVAL_S` seconds."""
        if self.clock() - self.written_at >= BEAT_INTERVAL_S:
            self._write()

    def set_pids(self, pids: list[int]) -> None:
        """Other processes of this role that answer :data:`STACK_DUMP_SIGNAL` (env workers); next write."""
        self.extra_pids = [p for p in pids if isinstance(p, int) and p > 0]

    def record(self) -> dict[str, Any]:
        """The record as written (see the module docstring)."""
        return {
            "role": self.role,
            "key": self.key,
            "pid": self.pid,
            "host": self.host,
            "time": self.clock(),
            "beat": self.beats,
            "progress": self.progress,
            "step": self.step,
            "phase": self.name,
            "waiting_for": self.waiting_for,
            "kind": self.kind,
            "size_bytes": self.size_bytes,
            "pids": [self.pid, *self.extra_pids],
        }

    def _write(self) -> None:
        self.beats += 1
        self.written_at = self.clock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # A liveness record is worthless after a crash of the machine: no fsync on the trainer's hot path.
            atomic_write_json(self.path, self.record(), sync=False)
        except OSError as e:
            if not self.failed:
                print(f"srl: cannot write the progress record {self.path}: {e}", file=sys.stderr, flush=True)
            self.failed = True
        else:
            self.failed = False
