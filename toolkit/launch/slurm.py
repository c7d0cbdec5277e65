"""Slurm job control from the login node: submit, read state, cancel, requeue.

Only Slurm's own command-line clients are used (``sbatch``, ``scontrol``, ``squeue``, ``scancel``), each with
a timeout, so this works on any cluster a user can submit to, and without accounting: ``sacct`` needs
slurmdbd, which many sites (and the local test cluster) lack. Job state is read from ``scontrol show job -o``
(one line per job record) and, if that fails, from ``squeue -t all``. Both only know a finished job for
``MinJobAge`` seconds (300 by default) after it ended; after that :func:`job_state` raises
:class:`JobNotFoundError`.

No torch, no vLLM: this module runs on login nodes.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path

from ..placement.slurm_records import expand_nodelist, parse_scontrol_record

# Environment prefixes that Slurm reads as input options (SBATCH_*, SRUN_*, SALLOC_*) or sets inside an
# allocation (SLURM_*). Submitting from inside a job would otherwise hand the new job its parent's geometry,
# e.g. SLURM_NTASKS or SLURM_MEM_PER_NODE, and sbatch would silently obey them.
_SCRUBBED_PREFIXES = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_")
# Kept: where the cluster's configuration lives is a property of the login node, not of a parent job.
_KEPT = frozenset({"SLURM_CONF"})

# Job states after which a job record never changes again (Slurm's JOB_STATE_BASE values that are final).
TERMINAL_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "SPECIAL_EXIT",
        "REVOKED",
    }
)
# Order used to summarise several records (array tasks) into one state: the first present wins.
_SUMMARY_ORDER = (
    "RUNNING",
    "COMPLETING",
    "CONFIGURING",
    "REQUEUED",
    "RESIZING",
    "SUSPENDED",
    "PENDING",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "TIMEOUT",
    "FAILED",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
    "SPECIAL_EXIT",
    "REVOKED",
    "CANCELLED",
    "COMPLETED",
)

DEFAULT_TIMEOUT_S = 30.0
SUBMIT_TIMEOUT_S = 120.0
# Bound on the squeue/scancel calls of a batch job stopping its own steps: a slow controller must not hold up the
# stop for long (the caller then stops the steps through srun instead).
STEP_TIMEOUT_S = 10.0


class SlurmCommandError(RuntimeError):
    """A Slurm client command failed, timed out, or is not installed.

    Attributes: ``cmd`` (argv list), ``returncode`` (None when it timed out or could not start), ``stderr``
    (text).
    """

    def __init__(self, cmd: Sequence[str], returncode: int | None, stderr: str, what: str = "failed"):
        self.cmd = list(cmd)
        self.returncode = returncode
        self.stderr = stderr.strip()
        self.what = what
        rc = "" if returncode is None else f" (exit code {returncode})"
        detail = f": {self.stderr}" if self.stderr else ""
        super().__init__(f"`{' '.join(self.cmd)}` {what}{rc}{detail}")


class SubmitError(SlurmCommandError):
    """``sbatch`` refused the job; ``stderr`` holds sbatch's own message.

    Example message: 'Batch job submission failed: Requested node configuration is not available'.
    """


class JobNotFoundError(SlurmCommandError):
    """Neither ``scontrol`` nor ``squeue`` knows the job: a wrong id, or it ended more than MinJobAge ago."""


@dataclass(frozen=True)
class JobState:
    """One Slurm job as the controller reports it.

    ``job_id`` names the job the way Slurm's users do: ``"12"``, an array task ``"12_3"`` or a het component
    ``"12+1"`` (asking for an array task or het component by its raw job id gives that form too).
    ``state`` is the base job state (``PENDING``, ``RUNNING``, ``COMPLETED``, ``FAILED``, ``CANCELLED``,
    ``TIMEOUT``, ``NODE_FAIL``, ``PREEMPTED``, ``OUT_OF_MEMORY``, ...). ``reason`` is Slurm's pending/finish
    reason or None when Slurm says ``None``. ``exit_code`` is the batch script's exit status and ``signal``
    the signal that ended it (``ExitCode=3:0`` gives 3 and 0; a cancel gives 0 and 15); both None while not
    final. ``restart_count`` counts requeues (``SLURM_RESTART_COUNT`` of the running attempt). ``node_list``
    is the expanded host list (empty while pending). ``start_time`` is None while pending (Slurm then reports
    an estimate); ``end_time`` is None until the job is final (Slurm reports the time-limit end before that).
    Times are naive local times, as Slurm prints them.

    For a heterogeneous job asked for by its leader id, ``het_components`` holds one JobState per component in
    offset order (``job_id`` ``"12+0"``, ``"12+1"``) and the top-level fields are component 0's. For a job
    array asked for by its array id, ``array_tasks`` holds one JobState per task record (a block of
    still-pending tasks is one record with ``job_id`` like ``"12_[2-3%2]"``), and ``state`` summarises them:
    running if any runs, else pending if any pends, else the most severe final state. ``raw`` is the parsed
    key/value record.
    """

    job_id: str
    state: str
    reason: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    restart_count: int = 0
    node_list: tuple[str, ...] = ()
    start_time: datetime | None = None
    end_time: datetime | None = None
    het_components: tuple[JobState, ...] = ()
    array_tasks: tuple[JobState, ...] = ()
    raw: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

    @property
    def is_terminal(self) -> bool:
        """True once the job can no longer change state (see ``TERMINAL_STATES``)."""
        return self.state in TERMINAL_STATES


# ------------------------------------------------------------------------------------------------------------
# Running the clients


def _run(
    cmd: Sequence[str],
    *,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    errors: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``cmd``; raise SlurmCommandError if it cannot start or times out. Callers check the exit code.

    ``errors`` is the decoding error handler of the output (default strict; ``"surrogateescape"`` keeps file
    names that are not valid UTF-8 as os.fsdecode does)."""
    try:
        return subprocess.run(
            list(cmd),
            capture_output=True,
            text=True,
            errors=errors,
            timeout=timeout_s,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            check=False,
        )
    except FileNotFoundError as e:
        raise SlurmCommandError(cmd, None, f"{cmd[0]} not found on PATH: {e}", "could not start") from e
    except OSError as e:  # found but not runnable: no permission, a file that is no program (ENOEXEC)
        raise SlurmCommandError(cmd, None, f"{cmd[0]}: {e}", "could not start") from e
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        raise SlurmCommandError(cmd, None, err, f"timed out after {timeout_s:g} s") from e


def scrubbed_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Return a copy of ``base`` (default ``os.environ``) minus SLURM_*, SBATCH_*, SRUN_*, SALLOC_* names.

    ``SLURM_CONF`` is kept. Use it for every sbatch/srun started from a process that may itself run inside a
    Slurm job, so the new job gets only the options we pass explicitly.
    """
    src = os.environ if base is None else base
    return {k: v for k, v in src.items() if k in _KEPT or not k.startswith(_SCRUBBED_PREFIXES)}


def submit(
    script_path: str | os.PathLike[str],
    *,
    extra_args: Iterable[str] = (),
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    timeout_s: float = SUBMIT_TIMEOUT_S,
) -> str:
    """Submit a batch script with ``sbatch --parsable``; return the job id (e.g. ``"42"``).

    ``extra_args`` go before the script path and override its ``#SBATCH`` lines. ``env`` (default
    ``os.environ``) is passed through :func:`scrubbed_env`. ``cwd`` is where sbatch runs, which sets the job's
    default working directory and resolves relative output paths. The ``;cluster`` suffix of a federated or
    multi-cluster answer is stripped. Raises :class:`SubmitError` (a SlurmCommandError) with sbatch's stderr
    when sbatch fails, prints no id, cannot start, or exceeds ``timeout_s`` seconds.
    """
    cmd = ["sbatch", "--parsable", *extra_args, str(script_path)]
    try:
        proc = _run(cmd, timeout_s=timeout_s, env=scrubbed_env(env), cwd=cwd)
    except SlurmCommandError as e:
        raise SubmitError(cmd, e.returncode, e.stderr, e.what) from e
    if proc.returncode != 0:
        raise SubmitError(cmd, proc.returncode, proc.stderr or proc.stdout)
    # sbatch may print warnings on earlier lines; the id is the last non-empty stdout line.
    lines = [ln.strip() for ln in proc.stdout.splitlines() if ln.strip()]
    job_id = lines[-1].split(";", 1)[0] if lines else ""
    if not job_id.isdigit():
        raise SubmitError(
            cmd,
            proc.returncode,
            f"no job id in sbatch output: {proc.stdout!r} {proc.stderr!r}",
            "printed no job id",
        )
    return job_id


def predict_start(
    script_path: str | os.PathLike[str],
    *,
    cwd: str | os.PathLike[str] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> str:
    """``sbatch --test-only SCRIPT``: Slurm's scheduler says when and where the job would start, without queueing
    it. Returns sbatch's output (the answer is on stderr: ``sbatch: Job N to start at TIME using K processors on
    nodes LIST in partition P``). Raises SlurmCommandError with sbatch's message when it refuses (e.g. a shape the
    partition cannot hold), cannot start, or exceeds ``timeout_s`` seconds."""
    cmd = ["sbatch", "--test-only", str(script_path)]
    proc = _run(cmd, timeout_s=timeout_s, env=scrubbed_env(), cwd=cwd)
    if proc.returncode != 0:
        raise SlurmCommandError(cmd, proc.returncode, proc.stderr or proc.stdout)
    return (proc.stderr or "") + (proc.stdout or "")


def cancel(job_id: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """``scancel`` the job (or array task / het job).

    scancel exits 0 for an unknown or already finished id, so cancelling twice is harmless. Raises
    SlurmCommandError when scancel fails (e.g. permission denied) or times out.
    """
    cmd = ["scancel", str(job_id)]
    proc = _run(cmd, timeout_s=timeout_s)
    if proc.returncode != 0:
        raise SlurmCommandError(cmd, proc.returncode, proc.stderr)


def job_steps(
    job_ids: Iterable[str], *, env: Mapping[str, str] | None = None, timeout_s: float = STEP_TIMEOUT_S
) -> dict[str, list[str]]:
    """The running steps of the jobs ``job_ids`` (a job, or each component of a het job) by step name (srun's
    ``--job-name``): name -> the ids of the steps so named, as Slurm prints them (``"12.3"``), read from ``squeue
    --steps``. ``env`` (default ``os.environ``) is squeue's environment. Raises SlurmCommandError when squeue fails,
    cannot start or exceeds ``timeout_s`` seconds."""
    cmd = ["squeue", "--steps", "--noheader", f"--jobs={','.join(job_ids)}", "--format=%i|%j"]
    proc = _run(cmd, timeout_s=timeout_s, env=env)
    if proc.returncode != 0:
        raise SlurmCommandError(cmd, proc.returncode, proc.stderr)
    steps: dict[str, list[str]] = {}
    for line in proc.stdout.splitlines():
        step, sep, name = line.strip().partition("|")
        if sep and step:
            steps.setdefault(name, []).append(step)
    return steps


def signal_steps(
    step_ids: Sequence[str],
    signal_name: str,
    *,
    env: Mapping[str, str] | None = None,
    timeout_s: float = STEP_TIMEOUT_S,
) -> None:
    """Send signal ``signal_name`` (``"TERM"``, ``"INT"``...) to every process of each job step in ``step_ids``
    (``"12.3"``) with ``scancel --signal``: Slurm delivers it on every node of the step. Unlike a signal to the
    step's ``srun``: srun answers SIGTERM by SIGKILLing its tasks at once. Raises SlurmCommandError when scancel
    fails (e.g. a step already ended), cannot start or exceeds ``timeout_s`` seconds."""
    # --ctld: through slurmctld, which sends the signal to the step's own nodes. Without it scancel (22.05) sends it
    # to every node of the job itself, and each node that runs no task of the step makes scancel fail ("Invalid job
    # id specified") although the step's nodes got the signal.
    cmd = ["scancel", "--ctld", f"--signal={signal_name}", *step_ids]
    proc = _run(cmd, timeout_s=timeout_s, env=env)
    if proc.returncode != 0:
        raise SlurmCommandError(cmd, proc.returncode, proc.stderr)


def requeue(job_id: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """``scontrol requeue`` a running or finished batch job.

    The job goes back to PENDING (Reason=BeginTime for about cred_expire seconds) and its restart count grows
    by one. Raises SlurmCommandError if Slurm refuses (e.g. the job is not requeueable, or unknown).
    """
    cmd = ["scontrol", "requeue", str(job_id)]
    proc = _run(cmd, timeout_s=timeout_s)
    if proc.returncode != 0:
        raise SlurmCommandError(cmd, proc.returncode, proc.stderr)


# ------------------------------------------------------------------------------------------------------------
# Reading job state

_NO_VALUE = {"", "(null)", "None", "N/A", "Unknown", "UNLIMITED"}


def _time(value: str | None) -> datetime | None:
    if value is None or value in _NO_VALUE:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def _int(value: str | None, default: int = 0) -> int:
    try:
        return int(value) if value not in (None, "") else default
    except ValueError:
        return default


# Where a record holds each JobState field: scontrol's keys, and the names of squeue's --Format fields.
_SCONTROL_KEYS = (
    "JobId",
    "HetJobId",
    "HetJobOffset",
    "ArrayJobId",
    "ArrayTaskId",
    "JobState",
    "Reason",
    "Restarts",
    "NodeList",
    "StartTime",
    "EndTime",
)
_SQUEUE_KEYS = (
    "JobID",
    "HetJobID",
    "HetJobOffset",
    "ArrayJobID",
    "ArrayTaskID",
    "State",
    "Reason",
    "RestartCnt",
    "NodeList",
    "StartTime",
    "EndTime",
)


def _state_from_record(rec: Mapping[str, str], keys: tuple[str, ...], exit_pair: tuple[int, int] | None) -> JobState:
    """The JobState of one record whose fields are named by ``keys`` (:data:`_SCONTROL_KEYS` or
    :data:`_SQUEUE_KEYS`); ``exit_pair`` is its (exit code, signal), decoded by the caller."""
    plain, het, offset, array, task, state, reason, restarts, nodes, start, end = (rec.get(k, "") for k in keys)
    if het not in _NO_VALUE:
        job_id = f"{het}+{offset or '0'}"
    elif array not in _NO_VALUE and task not in _NO_VALUE:
        job_id = f"{array}_{task}" if task.isdigit() else f"{array}_[{task}]"
    else:
        job_id = plain
    state = state.split()[0].rstrip("+") if state else "UNKNOWN"
    final = state in TERMINAL_STATES
    return JobState(
        job_id=job_id,
        state=state,
        reason=None if reason in _NO_VALUE else reason,
        exit_code=exit_pair[0] if final and exit_pair else None,
        signal=exit_pair[1] if final and exit_pair else None,
        restart_count=_int(restarts),
        node_list=tuple(expand_nodelist(nodes)),
        start_time=None if state == "PENDING" else _time(start),
        end_time=_time(end) if final else None,
        raw=dict(rec),
    )


def job_state_from_record(rec: Mapping[str, str]) -> JobState:
    """Build a JobState from one record parsed by :func:`parse_scontrol_record`."""
    code, _, sig = rec.get("ExitCode", "").partition(":")
    return _state_from_record(rec, _SCONTROL_KEYS, (int(code), _int(sig)) if code.isdigit() else None)


def summarize(job_id: str, records: Sequence[JobState]) -> JobState:
    """Fold the records one query returned into one JobState for ``job_id``.

    One record: itself (named as in the record). Het job (records carry ``+offset`` ids): component 0's fields
    plus ``het_components``. Array (``_task`` ids): summary state per ``_SUMMARY_ORDER``, nodes of all tasks,
    largest restart count, earliest start, latest end, exit code of the first task in the summary state; tasks
    in ``array_tasks``. Raises ValueError on an empty list.
    """
    if not records:
        raise ValueError(f"no records for job {job_id}")
    if len(records) == 1:
        return records[0]
    if all("+" in r.job_id for r in records):
        comps = tuple(sorted(records, key=lambda r: int(r.job_id.split("+", 1)[1])))
        return replace(comps[0], job_id=job_id, het_components=comps)
    if all("_" in r.job_id for r in records):
        tasks = tuple(sorted(records, key=_array_sort_key))
        present = {t.state for t in tasks}
        state = next((s for s in _SUMMARY_ORDER if s in present), tasks[0].state)
        first = next(t for t in tasks if t.state == state)
        final = state in TERMINAL_STATES
        starts = [t.start_time for t in tasks if t.start_time]
        ends = [t.end_time for t in tasks if t.end_time]
        nodes = tuple(dict.fromkeys(n for t in tasks for n in t.node_list))
        return JobState(
            job_id=job_id,
            state=state,
            reason=first.reason,
            exit_code=first.exit_code if final else None,
            signal=first.signal if final else None,
            restart_count=max(t.restart_count for t in tasks),
            node_list=nodes,
            start_time=min(starts) if starts else None,
            end_time=max(ends) if final and ends else None,
            array_tasks=tasks,
            raw=first.raw,
        )
    match = [r for r in records if r.job_id == job_id]
    return match[0] if match else records[0]


def _array_sort_key(t: JobState) -> tuple[int, str]:
    task = t.job_id.split("_", 1)[1]
    return (int(task), "") if task.isdigit() else (1 << 62, task)


# squeue --Format fields for the fallback; "|" ends each field so empty values stay aligned.
_SQUEUE_FIELDS = (
    "JobID",
    "ArrayJobID",
    "ArrayTaskID",
    "HetJobID",
    "HetJobOffset",
    "State",
    "Reason",
    "Exit_Code",
    "RestartCnt",
    "NodeList",
    "StartTime",
    "EndTime",
)


def parse_squeue_line(line: str) -> JobState:
    """Parse one line of ``squeue -h -t all -O <_SQUEUE_FIELDS each with suffix |>`` into a JobState.

    squeue's Exit_Code is the raw wait status (``768`` = exit 3; ``15`` = killed by SIGTERM), decoded as in
    POSIX ``WEXITSTATUS``/``WTERMSIG``.
    """
    rec = dict(zip(_SQUEUE_FIELDS, (v.strip() for v in line.split("|"))))
    status = rec.get("Exit_Code", "")
    exit_pair = ((int(status) >> 8) & 0xFF, int(status) & 0x7F) if status.isdigit() else None
    return _state_from_record(rec, _SQUEUE_KEYS, exit_pair)


# Job states in which a job may still write to its log files (squeue -t accepts these names).
_LIVE_STATES = "PENDING,CONFIGURING,RUNNING,COMPLETING,SUSPENDED,REQUEUED,REQUEUE_HOLD,RESIZING,STOPPED,SIGNALING"
# squeue --Format for jobs_logging_under; "|" ends each field. WorkDir is where a relative StdOut/StdErr goes.
_LOG_FIELDS = "JobID:|,WorkDir:|,STDOUT:|,STDERR:|"
# A JobID as squeue prints it: 12, array tasks 12_3 / 12_[1-3%2], het components 12+1.
_JOB_ID_RE = re.compile(r"[0-9]+(?:_(?:[0-9]+|\[[^\]|]*\]))?(?:\+[0-9]+)?")
# Above this many "|" inside one line's paths, splitting it every way costs too much: the job counts as logging
# under the run (a wrong "busy" only asks for --clean; a wrong "free" deletes what the job needs).
_MAX_AMBIGUOUS_BARS = 24


def jobs_logging_under(root: Path, *, besides: Path | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> list[str]:
    """Ids of the calling user's queued or running Slurm jobs whose stdout or stderr file lies under ``root`` but
    not under ``besides`` (a directory below ``root`` whose jobs are not the caller's concern: a run's gate jobs).

    srl's batch scripts log into their run directory (``--output``/``--error`` under ``<run>/logs``), so a job
    listed here, e.g. a dry run's script submitted by hand and still pending, will write into ``root``. Returns []
    where Slurm is not installed (no ``squeue`` on PATH: nothing can be queued). Raises SlurmCommandError when
    ``squeue`` is installed but fails, cannot start, times out after ``timeout_s`` seconds or prints lines that
    are not job records (the caller cannot tell, and must not assume the directory is free). The user is the
    process's uid (not $USER, which a shell may carry over from someone else). How paths are matched:
    :func:`jobs_logging_under_in`.
    """
    if shutil.which("squeue") is None:
        return []
    cmd = ["squeue", "-h", "-u", squeue_user(), "-t", _LIVE_STATES, "-O", _LOG_FIELDS]
    proc = _run(cmd, timeout_s=timeout_s, errors="surrogateescape")
    if proc.returncode != 0:
        raise SlurmCommandError(cmd, proc.returncode, proc.stderr)
    try:
        jobs = jobs_logging_under_in(proc.stdout, root)
        if jobs and besides is not None:
            other = set(jobs_logging_under_in(proc.stdout, besides))
            jobs = [j for j in jobs if j not in other]
        return jobs
    except ValueError as exc:
        raise SlurmCommandError(cmd, proc.returncode, str(exc), "printed no job records") from exc


def squeue_user() -> str:
    """The calling process's user for ``squeue -u``: the name of its uid in the user database, or the uid itself
    when it has no entry (some containers; squeue takes either). Not $USER or $LOGNAME (``getpass.getuser``),
    which a shell may carry over from someone else, so the listing would miss the caller's own jobs."""
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def jobs_logging_under_in(squeue_output: str, root: str | os.PathLike[str]) -> list[str]:
    """The job ids (each once, in squeue's order) of ``squeue -h -O JobID:|,WorkDir:|,STDOUT:|,STDERR:|`` output
    whose stdout or stderr file may lie under ``root``.

    Both sides are compared with symlinks resolved (a run directory linked to scratch, logs named by either
    path); ``/out/r2`` is not under ``/out/r``. A relative path is taken from the job's WorkDir. A path that still
    holds Slurm's filename patterns (``%j``, ``%x``, ``%u``... as squeue shows pending jobs) counts when its part
    before the first ``%`` could expand to a path under ``root``. A path containing ``|`` makes the line ambiguous:
    every way of splitting it into the three fields is tried, and any split under ``root`` counts. Empty and
    ``N/A``-like fields are no paths. Raises ValueError on a line that is not a job record (no job id, fewer
    fields). When in doubt a job counts: a wrong "free" answer would delete files a queued job needs.
    """
    base = os.path.realpath(root)
    jobs: dict[str, None] = {}
    for line in squeue_output.splitlines():
        if not line.strip():
            continue
        job_id, _, rest = line.partition("|")
        job_id = job_id.strip()
        if not _JOB_ID_RE.fullmatch(job_id) or not rest.endswith("|") or rest.count("|") < 3:
            raise ValueError(f"not a squeue job record: {line!r}")
        if _fields_under(rest[:-1], base):
            jobs[job_id] = None
    return list(jobs)


def _fields_under(fields: str, base: str) -> bool:
    """Whether ``WorkDir|StdOut|StdErr`` (split every possible way when the paths hold ``|``) names a log under
    ``base`` (a resolved absolute path)."""
    bars = [i for i, c in enumerate(fields) if c == "|"]
    if len(bars) > _MAX_AMBIGUOUS_BARS:
        return True
    for a in range(len(bars)):
        for b in range(a + 1, len(bars)):
            i, j = bars[a], bars[b]
            workdir, outs = fields[:i], (fields[i + 1 : j], fields[j + 1 :])
            if any(_log_under(p, workdir, base) for p in outs):
                return True
    return False


def _log_under(path: str, workdir: str, base: str) -> bool:
    for p in dict.fromkeys((path, path.strip())):
        if p.strip() in _NO_VALUE:
            continue
        if not os.path.isabs(p):
            wd = workdir.strip()
            if not os.path.isabs(wd):
                return True  # a relative log of a job whose working directory squeue did not say: cannot tell
            p = os.path.join(wd, p)
        if _may_expand_under(p, base):
            return True
    return False


def _may_expand_under(path: str, base: str) -> bool:
    literal, pattern, _ = path.partition("%")
    if not pattern:
        return os.path.commonpath([base, os.path.realpath(path)]) == base
    # Resolve the directories before the first pattern; the pattern may expand to anything, so the path may lie
    # under base when that fixed prefix already does, or when base continues it.
    head, _, partial = literal.rpartition("/")
    prefix = os.path.join(os.path.realpath(head or "/"), partial)
    return os.path.commonpath([base, prefix]) == base or (base.rstrip("/") + "/").startswith(prefix)


def job_state(job_id: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> JobState:
    """Return the current :class:`JobState` of ``job_id`` (plain, array task ``A_T``, het component ``J+K``).

    Reads ``scontrol show job -o``; if that fails, ``squeue -t all``. Raises :class:`JobNotFoundError` naming
    both commands and their errors when neither knows the job (wrong id, or ended over MinJobAge ago).
    """
    # Each reader: its command, which output lines are job records, and how one is parsed.
    readers = (
        (
            ["scontrol", "show", "job", "-o", str(job_id)],
            lambda ln: ln.startswith("JobId="),
            lambda ln: job_state_from_record(parse_scontrol_record(ln)),
        ),
        (
            ["squeue", "-h", "-t", "all", "-j", str(job_id), "-O", ",".join(f"{f}:|" for f in _SQUEUE_FIELDS)],
            str.strip,
            parse_squeue_line,
        ),
    )
    errors: list[SlurmCommandError] = []
    for cmd, is_record, parse in readers:
        try:
            proc = _run(cmd, timeout_s=timeout_s)
            lines = [ln for ln in proc.stdout.splitlines() if is_record(ln)]
            if proc.returncode == 0 and lines:
                return summarize(str(job_id), [parse(ln) for ln in lines])
            errors.append(SlurmCommandError(cmd, proc.returncode, proc.stderr or "no job record printed"))
        except SlurmCommandError as e:
            errors.append(e)
    raise JobNotFoundError(
        ["scontrol", "show", "job", str(job_id)],
        errors[0].returncode,
        "; ".join(str(e) for e in errors),
        "found no such job",
    )


def live_jobs(job_ids: Iterable[str], *, timeout_s: float = DEFAULT_TIMEOUT_S) -> list[str]:
    """The ones of ``job_ids`` that are not final yet (queued, running, requeued...), in order. A job Slurm no
    longer knows (:class:`JobNotFoundError`: it ended more than MinJobAge ago) counts as final."""
    out = []
    for job_id in job_ids:
        try:
            if not job_state(job_id, timeout_s=timeout_s).is_terminal:
                out.append(job_id)
        except JobNotFoundError:
            continue
    return out


def wait(job_id: str, *, timeout_s: float, until: Iterable[str] = TERMINAL_STATES, poll_s: float = 0.2) -> JobState:
    """Poll :func:`job_state` every ``poll_s`` seconds until its state is in ``until``; return that JobState.

    Polling is used instead of ``sbatch --wait``, whose client checks only every few seconds. Raises
    TimeoutError (with the last state seen) after ``timeout_s`` seconds; JobNotFoundError if the job vanishes.
    """
    wanted = frozenset(until)
    deadline = time.monotonic() + timeout_s
    while True:
        st = job_state(job_id)
        if st.state in wanted:
            return st
        if time.monotonic() >= deadline:
            raise TimeoutError(
                f"job {job_id} still {st.state} (reason {st.reason}) after {timeout_s:g} s; waited for {sorted(wanted)}"
            )
        time.sleep(poll_s)
