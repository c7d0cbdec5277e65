"""How a run ended: ``<run>/ending.json``, written by whoever decides it, read by launchers, ``srl status`` and
reports, and the exit status each ending maps to.

Causes and exit statuses (README lists the same table):

======  ==============  ==================================================================================
status  cause           meaning
======  ==============  ==================================================================================
0       ``completed``   the trainer reached ``max_steps``
1       ``failed``      a role (trainer, orchestrator, an engine, the router) failed; ``role`` names it
3       ``lease-lost``  another supervisor took the run over; this attempt stopped at once
4       ``no-signal``   the zero-signal guard stopped the run (``monitors.stop.max_empty_steps``)
5       ``criterion``   another stop criterion stopped it: trainer divergence, errored share, mismatch KL,
                        reward collapse (``criterion`` names it, ``reason`` says why)
6       ``time-limit``  the Slurm time limit (or a preemption) ended the job and it was not requeued
7       ``stalled``     the progress watchdog stopped the run: a role made no progress for its bound
                        (``monitors.stall_timeout_s``); ``role`` names it, ``reason`` says what it was doing
130     ``user``        stopped on request: Ctrl-C, ``srl cancel`` or a signal to the job
======  ==============  ==================================================================================

Status 2 stays the CLI's "bad config or command line" (nothing ran). A requeued job (``preempted``) exits 0 so
Slurm runs it again; its next attempt clears the record.

Who writes: a role that stops the run for a criterion calls :func:`record_criterion` before it writes the stop
request (the first criterion recorded wins); the supervisor (local launcher or batch job) calls :func:`settle`
once every process has ended, with what only it knows (a failed process, a signal, a lost lease), and prints
:meth:`Ending.line` last. :func:`clear` runs at the start of every attempt. Stdlib only: safe on the login node.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from toolkit.fsutil import atomic_write_json
from toolkit.run.layout import RunDir

from . import metrics

COMPLETED = "completed"
FAILED = "failed"
LEASE_LOST = "lease-lost"
NO_SIGNAL = "no-signal"
CRITERION = "criterion"
TIME_LIMIT = "time-limit"
STALLED = "stalled"
PREEMPTED = "preempted"
USER = "user"

# One place for the numbers: the CLI, the batch script and README's table all follow this mapping.
EXIT_STATUS = {
    COMPLETED: 0,
    PREEMPTED: 0,
    FAILED: 1,
    LEASE_LOST: 3,
    NO_SIGNAL: 4,
    CRITERION: 5,
    TIME_LIMIT: 6,
    STALLED: 7,
    USER: 130,
}
CAUSES = tuple(EXIT_STATUS)

# Criterion names (the ``criterion`` field).
ZERO_SIGNAL_GUARD = "zero-signal guard"
DIVERGENCE = "divergence"
STOP_CRITERIA = "monitors.stop"


@dataclass(frozen=True)
class Ending:
    """How a run's latest attempt ended.

    ``cause`` is one of :data:`CAUSES`; ``reason`` says why in words (the criterion's message, a process's exit
    status and log); ``criterion`` names the stop criterion (:data:`ZERO_SIGNAL_GUARD`, :data:`DIVERGENCE`,
    :data:`STOP_CRITERIA`), ``role`` the role that decided or failed; ``step`` is the newest trainer step recorded
    in ``metrics.jsonl`` (None before the first); ``time`` is seconds since the epoch; ``exception`` and ``where``
    name a failure's exception and the line that raised it.
    """

    cause: str
    reason: str = ""
    criterion: str | None = None
    role: str | None = None
    step: int | None = None
    time: float = field(default_factory=time.time)
    exception: str | None = None
    """A failure's exception as its traceback's last line says it (``ValueError: orchestrator.train.env is
    empty``), read from the failed role's log; None when the log holds no traceback."""
    where: str | None = None
    """``file:line`` of the innermost frame of that traceback (``toolkit/orchestrator/main.py:178``)."""

    def __post_init__(self) -> None:
        if self.cause not in EXIT_STATUS:
            raise ValueError(f"unknown run ending cause {self.cause!r}; one of {', '.join(CAUSES)}")

    @property
    def exit_status(self) -> int:
        """The exit status a command (the local launcher, the Slurm batch job) returns for this ending: 0 only when
        the run reached ``max_steps`` (or was requeued); a stop criterion is never 0 and never 1 (a failure)."""
        return EXIT_STATUS[self.cause]

    @property
    def resume_helps(self) -> bool:
        """Whether ``--resume`` (the same command, continuing from the newest complete checkpoint) can get past this
        ending: not for a failure whose exception is one the same config, code and data raise again
        (:data:`REPEATING_EXCEPTIONS`: a bad field, a missing module, a refused env), which needs fixing first."""
        if self.cause != FAILED or not self.exception:
            return self.cause not in (COMPLETED, LEASE_LOST)
        return exception_name(self.exception) not in REPEATING_EXCEPTIONS

    def summary(self) -> str:
        """One phrase: ``reached max_steps (step 200)``, ``stopped by the zero-signal guard at step 12: ...``."""
        at = f" at step {self.step}" if self.step is not None else ""
        why = f": {self.reason}" if self.reason else ""
        if self.cause == COMPLETED:
            return f"reached max_steps (step {self.step})" if self.step is not None else "reached max_steps"
        if self.cause == USER:
            return f"stopped by the user{at}{why or ' (Ctrl-C or srl cancel)'}"
        if self.cause in (NO_SIGNAL, CRITERION):
            return f"stopped by the {self.criterion or 'stop criteria'}{at}{why}"
        if self.cause == FAILED:
            if self.exception:
                raised = f" ({self.where})" if self.where else ""
                why = f": {self.exception}{raised}" + (f"; {self.reason}" if self.reason else "")
            return f"failed in {self.role or 'an unknown role'}{at}{why}"
        if self.cause == STALLED:
            return f"stopped by the progress watchdog{at}{why}"
        if self.cause == TIME_LIMIT:
            return f"ended by the Slurm time limit{at}{why}"
        if self.cause == PREEMPTED:
            # ``role`` set: the progress watchdog's stall requeued the job (monitors.stall_restarts)
            return f"{'stalled' if self.role else 'preempted'}{at}; requeued{why}"
        return f"stopped{at}: another supervisor took the run over{why}"

    def line(self) -> str:
        """The supervisor's last line: ``srl: run ended: <summary> (exit status N)``."""
        return f"srl: run ended: {self.summary()} (exit status {self.exit_status})"

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Ending:
        """Raises ValueError for a record that is not an ending."""
        if not isinstance(obj, dict) or "cause" not in obj:
            raise ValueError("not a run ending record")
        keys = ("cause", "reason", "criterion", "role", "step", "time", "exception", "where")
        known = {k: obj[k] for k in keys if k in obj}
        return cls(**known)


def read(run: RunDir) -> Ending | None:
    """The recorded ending of ``run``'s latest attempt; None while it runs, before it ever ran, or when the record
    is unreadable."""
    try:
        return Ending.from_json(json.loads(run.ending.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def write(run: RunDir, ending: Ending) -> Ending:
    """Write ``ending`` (atomically, replacing any earlier record); returns it."""
    atomic_write_json(run.ending, asdict(ending))
    return ending


def clear(run: RunDir) -> None:
    """Forget the previous attempt's ending (a new attempt starts)."""
    run.ending.unlink(missing_ok=True)


def record_criterion(run: RunDir, criterion: str, reason: str, *, role: str) -> Ending:
    """Record that ``role`` stops the run for ``criterion`` (:data:`ZERO_SIGNAL_GUARD` maps to ``no-signal``,
    anything else to ``criterion``), unless a criterion was recorded first (that one is kept and returned)."""
    earlier = read(run)
    if earlier is not None and earlier.cause in (NO_SIGNAL, CRITERION):
        return earlier
    cause = NO_SIGNAL if criterion == ZERO_SIGNAL_GUARD else CRITERION
    return write(run, Ending(cause, reason, criterion=criterion, role=role, step=metrics.newest_step(run.metrics)))


def criterion_of(stop_text: str) -> tuple[str, str, str] | None:
    """``(role, criterion, reason)`` of a stop request's text ``<role>: <reason>`` (as written by
    ``toolkit.orchestrator.stop.request_stop``); None for an empty request (a user's or a launcher's)."""
    text = stop_text.strip()
    if not text:
        return None
    role, _, reason = text.partition(": ")
    if not reason:
        role, reason = "", text
    if reason.startswith(ZERO_SIGNAL_GUARD):
        return role, ZERO_SIGNAL_GUARD, reason
    return role, (DIVERGENCE if role == "trainer" else STOP_CRITERIA), reason


def settle(
    run: RunDir,
    *,
    failed: str | None = None,
    failed_reason: str = "",
    user_stop: bool = False,
    time_limit: bool = False,
    requeued: bool = False,
    requeued_reason: str = "",
    lease_lost: bool = False,
    stalled: str | None = None,
    stalled_reason: str = "",
) -> Ending:
    """Decide and record how the attempt ended, once every process has ended; returns the ending.

    ``failed`` names the process (or role) whose failure ended the run, ``failed_reason`` says how (exit status,
    ``(log: PATH)``); the exception and the line that raised it are read from that log's last traceback (else from
    ``logs/latest/<process>.log``). The decision, first match wins: a lost lease (nothing is written: the run is someone
    else's now); a requeue; a stall (``stalled`` names the stuck role, ``stalled_reason`` what it was doing: the
    processes the watchdog then kills would otherwise read as failures; with ``requeued``, the stall that requeued the
    job, whose
    ``requeued_reason`` says so); a criterion recorded by a role (its own non-zero exit,
    as a diverged trainer's, is part of that stop, not a failure); a failure; the time limit; a user's stop; a
    stop request whose text names a criterion (a role that wrote it without a record); otherwise the run
    completed.
    """
    step = metrics.newest_step(run.metrics)
    if lease_lost:
        return Ending(LEASE_LOST, step=step)
    if requeued:
        why = requeued_reason or "the job's pre-timeout signal came; it checkpointed and requeued"
        return write(run, Ending(PREEMPTED, why, role=stalled, step=step))
    if stalled is not None:  # a hang outranks what the run was stopping for: nothing stopped cleanly
        return write(run, Ending(STALLED, stalled_reason, role=stalled, step=step))
    recorded = read(run)
    by_criterion = recorded is not None and recorded.cause in (NO_SIGNAL, CRITERION)
    if recorded is not None and by_criterion and (failed is None or _role_of(failed) == recorded.role):
        return write(run, replace(recorded, step=step))
    if failed is not None:
        err = last_exception(_failed_log(run, failed, failed_reason))
        return write(
            run,
            Ending(
                FAILED,
                failed_reason,
                role=failed,
                step=step,
                exception=err.exception if err else None,
                where=err.where if err else None,
            ),
        )
    if time_limit:
        return write(run, Ending(TIME_LIMIT, "the job was not requeued; resume it with --resume", step=step))
    try:
        stop_text: str | None = run.stop_request.read_text(errors="replace")
    except OSError:
        stop_text = None
    parsed = criterion_of(stop_text) if stop_text is not None else None
    if user_stop or (stop_text is not None and parsed is None):
        return write(run, Ending(USER, step=step))
    if parsed is not None:
        role, criterion, reason = parsed
        cause = NO_SIGNAL if criterion == ZERO_SIGNAL_GUARD else CRITERION
        return write(run, Ending(cause, reason, criterion=criterion, role=role or None, step=step))
    return write(run, Ending(COMPLETED, step=step))


def _role_of(process: str) -> str:
    """``trainer-1`` -> ``trainer``: a multi-node role's processes carry its name and a node index."""
    head, _, tail = process.rpartition("-")
    return head if head and tail.isdigit() else process


def _past_time_limit(now: float | None = None) -> bool:
    """True when this Slurm job is at its time limit (Slurm's ``SLURM_JOB_END_TIME``, within a minute): the
    signal that ended it was the time limit's, not ``scancel``'s or ``srl cancel``'s."""
    end = os.environ.get("SLURM_JOB_END_TIME", "")
    try:
        return (time.time() if now is None else now) >= int(end) - 60
    except ValueError:
        return False


def settle_after_signal(run: RunDir, signal: str | None, *, requeued: bool = False) -> Ending:
    """:func:`settle` for a Slurm batch job stopped by ``signal`` (``TERM``, ``INT``, ``USR1``..., without ``SIG``;
    None when none came) or requeued; returns the ending."""
    # TERM and INT come from scancel / srl cancel, or from Slurm at the time limit itself; any other signal is the
    # site's pre-timeout signal (slurm.signal) of a job that is not requeued.
    timed_out = signal is not None and (signal not in ("TERM", "INT") or _past_time_limit())
    return settle(run, user_stop=signal is not None and not timed_out, time_limit=timed_out, requeued=requeued)


# Exceptions that the same config, code and data raise again: a resume repeats them until the cause is fixed.
REPEATING_EXCEPTIONS = frozenset(
    {
        "ValueError",
        "TypeError",
        "KeyError",
        "IndexError",
        "AttributeError",
        "NameError",
        "AssertionError",
        "NotImplementedError",
        "ImportError",
        "ModuleNotFoundError",
        "SyntaxError",
        "IndentationError",
        "UnicodeDecodeError",
        "ValidationError",
        "ConfigError",
        "TasksetFieldError",
        "EnvFeatureError",
        "DataError",
        "ExportError",
        "JSONDecodeError",
    }
)


@dataclass(frozen=True)
class LoggedException:
    """The last traceback of a log: ``exception`` its last line (``Type: message``, the message's first line),
    ``where`` the innermost frame as ``file:line`` (None when the traceback shows no frame)."""

    exception: str
    where: str | None


_FRAME_RE = re.compile(r'^\s+File "([^"]+)", line (\d+)')
_TAIL_BYTES = 1 << 20  # a traceback is at the end of a failed role's log; its whole log may be gigabytes


def last_exception(log: Path | None) -> LoggedException | None:
    """The last Python traceback in ``log`` (its last MiB): the exception line that ends it and the innermost
    frame. Paths are shown relative to the working directory's srl checkout when under it (``toolkit/...``).
    None when there is no log or no traceback. Never raises."""
    if log is None:
        return None
    try:
        with open(log, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - _TAIL_BYTES))
            lines = f.read().decode("utf-8", errors="replace").splitlines()
    except OSError:
        return None
    starts = [i for i, ln in enumerate(lines) if ln.startswith("Traceback (most recent call last)")]
    if not starts:
        return None
    where = None
    for line in lines[starts[-1] + 1 :]:
        frame = _FRAME_RE.match(line)
        if frame:
            where = f"{_short(frame.group(1))}:{frame.group(2)}"
            continue
        if line[:1].isspace() or not line.strip():
            continue  # source lines, ^^^ markers, blank lines
        return LoggedException(line.strip()[:500], where)  # the first unindented line after the frames
    return None


def exception_name(exception: str) -> str:
    """``ValueError`` of ``ValueError: ...``; ``TasksetFieldError`` of ``toolkit.envs.registry.TasksetFieldError:
    ...``."""
    return exception.split(":", 1)[0].strip().rsplit(".", 1)[-1]


def _short(path: str) -> str:
    """``path`` from its ``toolkit/`` or ``site-packages/`` part on (the frame a reader can open), else as is."""
    for marker in ("/toolkit/", "/site-packages/"):
        if marker in path:
            return path[path.rindex(marker) + (1 if marker == "/toolkit/" else len(marker)) :]
    return path


_LOG_IN_REASON = re.compile(r"\(log: ([^)]+)\)")


def _failed_log(run: RunDir, process: str, reason: str) -> Path | None:
    """The failed process's log: the one its reason names, else ``logs/latest/<process>.log`` or the role's."""
    named = _LOG_IN_REASON.search(reason or "")
    candidates = ([Path(named.group(1))] if named else []) + [
        run.latest_logs / f"{process}.log",
        run.latest_logs / f"{_role_of(process)}.log",
    ]
    return next((p for p in candidates if p.is_file()), None)
