"""The supervisor's progress watchdog: which role stopped making progress, for how long, and what it was doing.

A hung trainer (a deadlocked collective looks, from outside, like a process stopped with ``SIGSTOP``) writes
nothing and exits never; without a watchdog the run would wait forever. The roles keep progress records
(:mod:`toolkit.run.heartbeat`); :class:`ProgressWatch` reads them with the supervisor's own monotonic clock and
names the stuck role once a record's progress stood still longer than its bound (:class:`Bounds`, from
``[monitors]``). :class:`HealthWatch` does the same for engines from their /health answers. The functions at the
end collect the evidence: each stuck process's ``/proc`` state, and its Python stacks, which it writes to its own
log on :data:`toolkit.run.heartbeat.STACK_DUMP_SIGNAL` (a stopped process cannot: that is said instead).

Who is blamed, among the records that stood still past their bound (first rule that names anyone):

1. processes that stopped beating too: stuck in a call, a collective, or stopped;
2. processes not waiting on another role, or waiting on a role that has no live process any more (a trainer
   waiting for batches from an orchestrator that exited);
3. when every watched role waits on another watched one (a deadlock between roles that still beat), all of them.

An orchestrator waiting for inference (its serving gate closed while an engine is down or restarting) is not
blamed while an engine process lives: the engine's own bounds (``HealthWatch``, ``inference.startup_timeout_s``)
end a restart that never serves.

A process that waits, beats, and whose peer is alive is never blamed: its peer's own record decides. A live
process without a record is not judged (each watched role writes one first thing in its entry point). Pure logic
apart from the evidence functions; times are seconds from ``time.monotonic()`` supplied by the caller.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Any

from ..run.heartbeat import LONG, STACK_DUMP_SIGNAL, STARTUP, WEIGHTS

GIB = float(2**30)
# Seconds a process gets to write its stacks (faulthandler writes from the signal handler: well under a second)
# before it is killed.
DUMP_WAIT_S = 2.0
# Bound on one py-spy dump (optional; only when installed).
PY_SPY_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Bounds:
    """How long a phase may go without progress, seconds: ``timeout_s`` (``monitors.stall_timeout_s``, > 0);
    start-up and other long phases ``timeout_s * startup_factor``; weight phases ``timeout_s + s_per_gib * GiB
    moved``."""

    timeout_s: float
    startup_factor: float = 3.0
    s_per_gib: float = 120.0

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ValueError(f"monitors.stall_timeout_s must be > 0 seconds, got {self.timeout_s!r}")

    @classmethod
    def from_config(cls, monitors: Any) -> Bounds:
        """From a ``[monitors]`` section (``toolkit.config.model.MonitorsConfig``)."""
        return cls(monitors.stall_timeout_s, monitors.stall_startup_factor, monitors.stall_s_per_gib)

    def bound(self, record: dict[str, Any] | None) -> float:
        """The bound of the phase ``record`` is in; a process without a record yet is starting up."""
        kind = STARTUP if record is None else record.get("kind")
        if kind in (STARTUP, LONG):
            return self.timeout_s * self.startup_factor
        if kind == WEIGHTS:
            size = record.get("size_bytes") if record else 0
            return self.timeout_s + self.s_per_gib * (float(size) / GIB if isinstance(size, int | float) else 0.0)
        return self.timeout_s


@dataclass
class _Seen:
    role: str
    record: dict[str, Any] | None
    progress_at: float  # when its progress last changed (or it was first seen)
    beat_at: float  # when it last wrote anything


@dataclass(frozen=True)
class Stall:
    """A process that made no progress for ``idle_s`` (> ``bound_s``) seconds. ``key``: its record's key
    (``trainer.rank0``) or, without a record, its role; ``record``: its last progress record (None: it never
    wrote one); ``hung``: it stopped beating too; ``peer_gone``: the role it waits on has no live process."""

    key: str
    role: str
    record: dict[str, Any] | None
    idle_s: float
    bound_s: float
    hung: bool
    peer_gone: bool = False

    @property
    def step(self) -> int | None:
        step = (self.record or {}).get("step")
        return step if isinstance(step, int) else None

    @property
    def phase(self) -> str:
        return str((self.record or {}).get("phase") or "never reported progress")

    def message(self) -> str:
        """``trainer made no progress for 600 s at step 5 (phase: train step 5; bound 600 s)``."""
        at = f" at step {self.step}" if self.step is not None else ""
        extra = ""
        waits = (self.record or {}).get("waiting_for")
        if self.peer_gone and waits:
            extra = f"; the {waits} it waits for has exited"
        elif not self.hung and waits:
            extra = f"; waiting for the {waits}"
        return (
            f"{self.role} made no progress for {self.idle_s:.0f} s{at} (phase: {self.phase}{extra}; bound "
            f"{self.bound_s:.0f} s, monitors.stall_timeout_s)"
        )

    def pids(self) -> list[int]:
        """The processes to ask for stacks (the role's own and those it listed, e.g. env workers)."""
        rec = self.record or {}
        out = [p for p in rec.get("pids") or [] if isinstance(p, int) and p > 0]
        pid = rec.get("pid")
        if isinstance(pid, int) and pid > 0 and pid not in out:
            out.insert(0, pid)
        return out


@dataclass
class ProgressWatch:
    """Follows the progress records of the live processes of ``roles`` and names a stalled one (see the module
    docstring). Call :meth:`observe` every few seconds with the records (:func:`toolkit.run.heartbeat.read_all`)
    and the roles that have a live process."""

    bounds: Bounds
    roles: tuple[str, ...] = ("trainer", "orchestrator")
    seen: dict[str, _Seen] = field(default_factory=dict)

    def observe(
        self, records: dict[str, dict[str, Any]], live_roles: set[str] | frozenset[str], now: float
    ) -> list[Stall]:
        """Update what was seen at ``now`` and return the stalled processes to blame, longest idle first ([]
        while everything progresses). ``live_roles``: every role with a live process, served ones (inference)
        included: a record may wait on them."""
        live = {r for r in live_roles if r in self.roles}
        current: dict[str, _Seen] = {}
        for key, rec in records.items():
            role = rec.get("role")
            if role not in live:
                continue
            old = self.seen.get(key)
            if old is None or old.record is None or old.role != role:
                current[key] = _Seen(role, rec, now, now)
                continue
            moved = _progress_of(rec) != _progress_of(old.record)
            beat = rec.get("beat") != old.record.get("beat") or rec.get("time") != old.record.get("time")
            current[key] = _Seen(role, rec, now if moved else old.progress_at, now if beat or moved else old.beat_at)
        # A live process without a record is not judged: every watched role writes one first thing in its entry
        # point, and a role that does not report (an older one) must not be taken for a stuck one.
        self.seen = current
        return self._blame(live, set(live_roles), now)

    def last_progress(self) -> float:
        """The latest time (the caller's clock, as passed to :meth:`observe`) any live process's record was seen to
        progress; ``-inf`` before any was."""
        return max((s.progress_at for s in self.seen.values()), default=float("-inf"))

    def excuse(self, role: str, now: float) -> None:
        """Start the progress clocks of ``role``'s records again at ``now``: it waits on something the records do
        not show (an engine that does not answer /health, whose own bound the engine watch keeps)."""
        for key, s in self.seen.items():
            if s.role == role:
                self.seen[key] = _Seen(s.role, s.record, now, now)

    def _blame(self, live: set[str], live_all: set[str], now: float) -> list[Stall]:
        stalled: list[Stall] = []
        for key, s in self.seen.items():
            bound = self.bounds.bound(s.record)
            idle = now - s.progress_at
            if idle > bound:
                waits = (s.record or {}).get("waiting_for")
                stalled.append(
                    Stall(
                        key,
                        s.role,
                        s.record,
                        idle,
                        bound,
                        hung=now - s.beat_at > bound,
                        peer_gone=bool(waits) and waits not in live_all,
                    )
                )
        stalled.sort(key=lambda x: -x.idle_s)
        hung = [x for x in stalled if x.hung]
        if hung:
            return hung
        # Waiting on a live peer is not a stall of one's own: a watched peer's record decides, and a served one
        # (inference: an engine down or restarting) is bounded by the supervisor's engine watch.
        free = [x for x in stalled if x.peer_gone or not (x.record or {}).get("waiting_for")]
        if free:
            return free
        # Every watched role waits on another watched one: a deadlock between roles that still beat.
        if (
            stalled
            and {x.role for x in stalled} >= live
            and all((x.record or {}).get("waiting_for") in self.roles for x in stalled)
        ):
            return stalled
        return []


def _progress_of(rec: dict[str, Any]) -> tuple[Any, ...]:
    return rec.get("progress"), rec.get("step"), rec.get("phase"), rec.get("pid")


@dataclass
class HealthWatch:
    """When each engine last answered /health; :meth:`overdue` names those silent for longer than
    ``timeout_s``."""

    timeout_s: float
    last_ok: dict[str, float] = field(default_factory=dict)

    def reset(self, name: str, now: float) -> None:
        """Start (or restart, after an engine restart) ``name``'s clock at ``now``."""
        self.last_ok[name] = now

    def observe(self, name: str, healthy: bool, now: float) -> None:
        if healthy or name not in self.last_ok:
            self.last_ok[name] = now

    def silent_for(self, name: str, now: float) -> float:
        return now - self.last_ok.get(name, now)

    def overdue(self, now: float) -> list[str]:
        return sorted(n for n, t in self.last_ok.items() if now - t > self.timeout_s)


# ---- evidence ----------------------------------------------------------------------------------------------------


def proc_state(pid: int) -> str | None:
    """The process's state letter from ``/proc/<pid>/stat`` (``R``, ``S``, ``D``, ``T`` stopped, ``Z``...); None
    when it is gone or not on this machine."""
    try:
        text = open(f"/proc/{pid}/stat", encoding="ascii", errors="replace").read()  # noqa: SIM115
    except OSError:
        return None
    # The command name may hold spaces and parentheses: the state is the first field after its last ')'.
    rest = text[text.rfind(")") + 1 :].split()
    return rest[0] if rest else None


def describe_state(state: str | None) -> str:
    if state is None:
        return "gone (or not on this machine)"
    if state == "T" or state == "t":
        return (
            f"stopped (state {state}): a stopped process cannot dump its stacks until it is continued; it is "
            "killed instead"
        )
    return f"state {state}; asked to write its Python stacks to its log"


def request_stacks(pids: list[int]) -> dict[int, str | None]:
    """Ask each of ``pids`` (on this machine) for its Python stacks (:data:`STACK_DUMP_SIGNAL`, answered by
    ``faulthandler`` in the role's own log) unless it is stopped or gone; returns each pid's state (before)."""
    states: dict[int, str | None] = {}
    for pid in pids:
        states[pid] = st = proc_state(pid)
        if st is not None and st not in ("T", "t", "Z"):
            try:
                os.kill(pid, STACK_DUMP_SIGNAL)
            except (ProcessLookupError, PermissionError):
                states[pid] = None
    return states


def py_spy_dump(pid: int) -> str | None:
    """``py-spy dump`` of ``pid`` when py-spy is installed (optional; bounded by :data:`PY_SPY_TIMEOUT_S`), else
    None."""
    exe = shutil.which("py-spy")
    if exe is None:
        return None
    try:
        r = subprocess.run(
            [exe, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=PY_SPY_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"py-spy dump failed: {e}"
    return (r.stdout + r.stderr).strip()


def remote_probe_script(pids: list[int]) -> str:
    """A ``sh`` script that prints ``<pid> <state>`` for each of ``pids`` and sends each one that is neither
    stopped nor gone :data:`STACK_DUMP_SIGNAL`: what the batch job runs on another node (through ``srun``)."""
    sig = int(STACK_DUMP_SIGNAL)
    ids = " ".join(str(int(p)) for p in pids)
    return (
        f"for p in {ids}; do s=$(sed 's/.*) //' /proc/$p/stat 2>/dev/null | cut -d' ' -f1); "
        f'echo "$p ${{s:-gone}}"; case "$s" in ""|T|t|Z) ;; *) kill -{sig} $p 2>/dev/null;; esac; done'
    )


def parse_probe(text: str) -> dict[int, str | None]:
    """The states printed by :func:`remote_probe_script` (``gone`` -> None)."""
    out: dict[int, str | None] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit():
            out[int(parts[0])] = None if parts[1] == "gone" else parts[1]
    return out
