"""Process helpers shared by the roles (no torch, no vllm: the orchestrator and login-node code import this).

- :func:`die_with_parent`: a process asks the kernel to kill it when its parent dies.
- :func:`kill_with_parent_preexec`: the same, set up by a parent for a child it is about to start.
- :class:`GroupReaper` (and ``python -m toolkit.procutil reap``): a small watcher that kills a supervisor's process
  groups when the supervisor dies by any path, SIGKILL included.
- :func:`process_start_time`: tells a live process from a later one that reused its PID.
- :func:`exit_words`: a child's exit status in words.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent() -> bool:
    """Ask the kernel to SIGKILL this process when its parent dies (prctl(2) ``PR_SET_PDEATHSIG``).

    For helper processes whose parent owns their lifetime (torchrun workers, the orchestrator's record writer):
    killed with the parent, they must not live on as orphans that keep writing into a run directory that a
    requeued job now owns. Returns whether the request took effect (Linux only); exits at once if the parent is
    already gone (this process was re-parented before the request).
    """
    if not sys.platform.startswith("linux"):
        return False
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        return False
    if os.getppid() != parent or parent == 1:  # the parent died before the request took effect
        os._exit(1)
    return True


def kill_with_parent_preexec() -> Callable[[], None] | None:
    """A ``preexec_fn`` for ``subprocess.Popen`` that makes the child receive SIGKILL when the calling *thread*
    dies (prctl(2) ``PR_SET_PDEATHSIG``; the kernel ties the signal to the thread that forked, so start children
    from a thread that lives as long as the supervisor, e.g. the main thread). The child exits at once when the
    parent died between fork and the request. Returns None off Linux (nothing to set up).

    Everything the child runs is prepared here, in the parent: between fork and exec the child must not import,
    load libraries or take locks another thread of the parent may hold.
    """
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()
    sig = int(signal.SIGKILL)

    def _preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return _preexec


def exit_words(returncode: int | None) -> str:
    """A child's exit status as ``subprocess`` reports it, in words: ``"exited with status 1"``, ``"killed by
    SIGKILL"`` (negative: the signal), ``"still running"`` (None)."""
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with status {returncode}"


def process_start_time(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (``/proc/<pid>/stat`` field 22), or None when the process
    does not exist or /proc cannot say (not Linux). Two processes with the same PID differ here."""
    try:
        return int(_stat_fields(pid)[19])
    except (IndexError, ValueError):
        return None


def _stat_fields(pid: int) -> list[bytes]:
    """Fields 3 onwards of ``/proc/<pid>/stat`` (the state first); [] when it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return []
    # The command name (field 2) may hold spaces and parentheses: fields after it start past the last ')'.
    return data[data.rfind(b")") + 2 :].split()


def pid_alive(pid: int, start_time: int | None = None) -> bool:
    """Whether process ``pid`` exists (and, with ``start_time``, is the same process that had that start time
    rather than a later one that reused the PID). A zombie counts as gone. Local to this machine."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    if _stat_fields(pid)[:1] == [b"Z"]:
        return False
    if start_time is not None:
        now = process_start_time(pid)
        if now is not None and now != start_time:
            return False
    return True


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (children, their children, ...), from ``/proc``; parents before children.
    Local to this machine; a process that exits meanwhile is skipped."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if len(fields) > 1 and fields[0] != b"Z":
                children.setdefault(int(fields[1]), []).append(int(entry))
    out: list[int] = []
    todo = list(children.get(pid, []))
    while todo:
        p = todo.pop(0)
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def end_descendants(grace_s: float) -> list[int]:
    """SIGTERM every process below this one, then SIGKILL those still alive after ``grace_s`` seconds; returns the
    pids signalled. Why: programs a library started in their own sessions (a harness program, a tool server) do
    not die with this process's group."""
    pids = descendants(os.getpid())
    _term_then_kill(pids, os.kill, pid_alive, grace_s)
    return pids


def _term_then_kill(
    targets: Iterable[int], send: Callable[[int, int], None], alive: Callable[[int], bool], grace_s: float
) -> None:
    """``send(target, SIGTERM)`` to each target, wait up to ``grace_s`` seconds while any is ``alive``, then
    ``send(target, SIGKILL)`` to each (a target already gone is skipped)."""
    targets = list(targets)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for t in targets:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                send(t, sig)
        if sig == signal.SIGTERM:
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline and any(alive(t) for t in targets):
                time.sleep(0.05)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def kill_groups(pgids: set[int], grace_s: float) -> None:
    """SIGTERM each process group in ``pgids``, then SIGKILL the groups still alive after ``grace_s`` seconds."""
    _term_then_kill(pgids, os.killpg, _group_alive, grace_s)


class GroupReaper:
    """Kills a supervisor's process groups when the supervisor dies, however it dies.

    The supervisor starts each child in a process group of its own (so it can stop the child's whole tree) and
    tells the reaper about it with :meth:`add`. The reaper is a separate process in a session of its own (a signal
    to the supervisor's group does not reach it), reading group ids from a pipe whose only writer is the
    supervisor: when the supervisor exits or is killed, the kernel closes the pipe, the reaper reads end-of-file
    and stops every group it was told about (SIGTERM, then SIGKILL after ``grace_s`` seconds). The kernel's
    parent-death signal only reaches direct children; the engines' worker processes and other grandchildren are
    in those groups. On a clean stop the supervisor has already stopped the groups; the reaper then finds them gone.
    """

    def __init__(self, grace_s: float = 3.0) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "toolkit.procutil", "reap", "--grace", str(grace_s)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        """PID of the reaper process."""
        return self._proc.pid

    def _send(self, line: str) -> None:
        with contextlib.suppress(BrokenPipeError, ValueError):  # reaper killed: the children's death signal holds
            assert self._proc.stdin is not None
            self._proc.stdin.write(line.encode() + b"\n")
            self._proc.stdin.flush()

    def add(self, pgid: int) -> None:
        """Watch process group ``pgid``."""
        self._send(f"+{pgid}")

    def discard(self, pgid: int) -> None:
        """Forget ``pgid`` (its group was stopped and reaped: the number may be reused by someone else)."""
        self._send(f"-{pgid}")

    def close(self, timeout_s: float = 10.0) -> None:
        """End the reaper: it stops any group still alive, then exits. Waits up to ``timeout_s`` seconds."""
        if self._proc.stdin is not None and not self._proc.stdin.closed:
            with contextlib.suppress(BrokenPipeError):
                self._proc.stdin.close()
        try:
            self._proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def _reap_main(argv: list[str]) -> int:
    grace = float(argv[argv.index("--grace") + 1]) if "--grace" in argv else 3.0
    # The supervisor's Ctrl-C or a TERM to its terminal's group must not end the watcher before it has done its job.
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)
    groups: set[int] = set()
    for raw in sys.stdin.buffer:
        line = raw.strip()
        if line[:1] == b"+":
            groups.add(int(line[1:]))
        elif line[:1] == b"-":
            groups.discard(int(line[1:]))
    kill_groups(groups, grace)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["reap"]:
        sys.exit(_reap_main(sys.argv[2:]))
    print("usage: python -m toolkit.procutil reap [--grace SECONDS]", file=sys.stderr)
    sys.exit(2)
