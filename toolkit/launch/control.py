"""``srl status``, ``srl cancel`` and ``srl logs`` for a run directory; ``srl status`` without one lists the runs
under the output directory.

Job state comes from ``scontrol show job``/``squeue`` (``toolkit.launch.slurm.job_state``), never ``sacct``, so
these work on clusters without accounting. A job that ended more than MinJobAge ago is reported as "unknown
(finished long ago)"; the run directory (logs, checkpoints, metrics) is still there.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from .. import lease as leases
from ..run import ending
from ..run.layout import RunDir
from . import slurm
from .progress import continue_command_for, progress_lines, resolved_max_steps
from .submit import read_job_ids


def _parser(prog: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=f"srl {prog}")
    ap.add_argument("run_dir", type=Path)
    return ap


def _not_a_run(run: RunDir) -> str:
    """Why ``run`` is not a run directory, in words: a path that does not exist is not "a directory without
    configs/"."""
    if not run.root.exists():
        return f"{run.root} does not exist; give the run directory `srl rl` printed"
    return f"{run.root}: not a run directory (no configs/); give the directory `srl rl` printed"


def _grace_seconds(text: str) -> float:
    """``--grace``: finite seconds >= 0 (argparse type). 'nan' skipped the wait and 'inf' waited forever."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be seconds >= 0 (got {text!r})")
    return value


def status_main(args: list[str]) -> int:
    """Print the run's progress (from its run directory: steps, reward, checkpoints, published weights, the local
    launcher) and each submitted Slurm job with its state, exit code, nodes and restart count; for a sweep's root,
    one line per point (:func:`toolkit.launch.sweeps.status_main`). Without a run directory, or given a directory
    that holds runs (``--output-dir``, default ``outputs``), one line per run: :func:`list_runs`. Exit 1 when the
    directory is neither a run directory nor holds any."""
    ap = argparse.ArgumentParser(
        prog="srl status",
        description="A run's progress; without RUN_DIR, every run under "
        "the output directory (name, state, step, reward).",
    )
    ap.add_argument("run_dir", type=Path, nargs="?", help="a run directory, a sweep's directory or an output directory")
    ap.add_argument(
        "--output-dir",
        type=Path,
        default=Path("outputs"),
        help="where to list runs when no RUN_DIR is given (default: outputs)",
    )
    a = ap.parse_args(args)
    from . import sweeps

    if a.run_dir is None or (
        a.run_dir.is_dir()
        and not (a.run_dir / "configs").exists()
        and not sweeps.is_sweep_root(a.run_dir)
        and run_dirs(a.run_dir)
    ):
        return list_runs(a.run_dir or a.output_dir)
    if sweeps.is_sweep_root(a.run_dir):
        return sweeps.status_main(a.run_dir)
    run = RunDir(a.run_dir)
    gates = gate_lines(run)
    if not run.configs.is_dir():
        if not gates:
            print(_not_a_run(run), file=sys.stderr)
            return 1
        print(f"run {run.root}: no training attempt yet")
        for line in gates:
            print(f"  {line}")
        return 0
    jobs = read_job_ids(run)
    # Each job's state: a JobState, None when Slurm no longer knows the job (finished long ago), or the error that
    # kept it from being read.
    states: list[tuple[str, str, int, Any]] = []
    for job_id, kind, attempt in jobs:
        try:
            states.append((job_id, kind, attempt, slurm.job_state(job_id)))
        except slurm.JobNotFoundError:
            states.append((job_id, kind, attempt, None))
        except slurm.SlurmCommandError as e:
            states.append((job_id, kind, attempt, e))
    jobs_final = bool(states) and all(
        st is None or (isinstance(st, slurm.JobState) and st.is_terminal) for *_, st in states
    )
    print(f"run {run.root}")
    from .prepare import only_dry_runs

    if only_dry_runs(run):
        print("  dry runs only: nothing was launched from this directory (its files show what would run)")
    holder = leases.read(run)
    if holder is not None:
        dead = holder.dead_reason()
        print(f"  supervised by {holder.describe()}" + (f" -- dead: {dead}" if dead else ""))
    for line in [*gates, *progress_lines(run, max_steps=resolved_max_steps(run), jobs_final=jobs_final)]:
        print(f"  {line}")
    if not jobs:
        print("  no Slurm job recorded (a local run, or never submitted)")
        return 0
    for job_id, kind, attempt, st in states:
        if st is None:
            print(f"{job_id}\t{kind}\tattempt {attempt}\tunknown (finished long ago; see {run.logs})")
            continue
        if isinstance(st, slurm.SlurmCommandError):
            print(f"{job_id}\t{kind}\tattempt {attempt}\tcannot read state: {st}", file=sys.stderr)
            continue
        bits = [
            st.state,
            st.reason and f"reason={st.reason}",
            st.exit_code is not None and f"exit={st.exit_code}:{st.signal or 0}",
            st.restart_count and f"restarts={st.restart_count}",
            st.node_list and "nodes=" + ",".join(st.node_list),
        ]
        print(f"{job_id}\t{kind}\tattempt {attempt}\t" + " ".join(b for b in bits if b))
        why = _dependency_note(st)
        if why:
            print(f"  {why}")
    return 0


def gate_lines(run: RunDir) -> list[str]:
    """One line per first-run gate of ``run`` (``srl eval validate`` / ``srl eval run``) that left a verdict in its
    ``reports/`` or a Slurm job directory (``<run>/eval/<command>``): passed, FAILED naming the failed items, or, when
    the gate's newest Slurm job did not write the newest verdict (its attempt is not the verdict's), what Slurm says
    of that job: queued or running, or ended without a verdict (that verdict is then only the previous one). Slurm is
    asked only then; when it does not answer, the line says so."""
    from ..run.verdict import GATE_ATTEMPT, GATE_STEMS, read_verdict

    out = []
    for command, stem in GATE_STEMS.items():
        verdict, job_dir = read_verdict(run, stem), run.gate_run(command)
        launched = job_dir.configs.is_dir()
        if verdict is None and not launched:
            continue
        if verdict is None:
            judged = None
        elif verdict.passed:
            judged = "passed"
        else:
            judged = "FAILED (" + ", ".join(f"{i.env}/{i.key}" for i in verdict.failed()) + ")"
        jobs = read_job_ids(job_dir) if launched else []
        state = judged or "no verdict yet"
        # A verdict without the attempt came from a gate run in a login node's process: nothing to compare with.
        verdict_attempt = verdict.settings.get(GATE_ATTEMPT) if verdict else 0
        if jobs and verdict_attempt is not None and jobs[-1][2] != verdict_attempt:
            job_id = jobs[-1][0]
            previous = f" (the previous verdict: {judged})" if judged else ""
            try:
                live = bool(slurm.live_jobs([job_id]))
            except slurm.SlurmCommandError:
                state = f"gate job {job_id}: Slurm did not answer{previous}"
            else:
                doing = "is queued or running" if live else "ended without a verdict"
                state = f"gate job {job_id} {doing}{previous}"
        where = f"; its Slurm job: srl status {job_dir.root}" if launched else ""
        out.append(f"first-run gate, srl eval {command}: {state}{where}")
    return out


def run_dirs(out_dir: Path) -> list[Path]:
    """The run directories directly under ``out_dir`` that hold a real run, by name: a launched attempt in
    ``configs/``. Left out: directories that only ever held dry runs (their attempts carry the dry-run marker),
    hidden ones (``.dry-run/``: dry runs of existing runs), and directories without ``configs/`` (the eval gate's
    ``reports/`` alone). [] when ``out_dir`` is missing or unreadable."""
    from .prepare import only_dry_runs

    try:
        entries = sorted(out_dir.iterdir())
    except OSError:
        return []
    return [
        p for p in entries if not p.name.startswith(".") and (p / "configs").is_dir() and not only_dry_runs(RunDir(p))
    ]


def run_state(run: RunDir) -> str:
    """One word or a few for where ``run`` stands: ``running`` (a live supervisor holds its lease), how its latest
    attempt ended (``completed``, ``failed``, ``user``, ... with the exit status), ``queued``/``starting`` (a Slurm
    job of it waits or starts), or ``gone without an ending`` (its supervisor died unrecorded)."""
    holder = leases.read(run)
    if holder is not None and holder.dead_reason() is None:
        return "running" + (f" (job {holder.job_id})" if holder.job_id else "")
    end = ending.read(run)
    if end is not None:
        return f"{end.cause} (exit {end.exit_status})"
    jobs = read_job_ids(run)
    if jobs:
        job_id = jobs[-1][0]
        try:
            st = slurm.job_state(job_id)
        except slurm.JobNotFoundError:
            return f"gone without an ending (job {job_id})"
        except slurm.SlurmCommandError:
            return f"unknown (job {job_id}: Slurm did not answer)"
        if not st.is_terminal:
            return f"{'queued' if st.state == 'PENDING' else 'starting'} (job {job_id})"
        return f"gone without an ending (job {job_id} {st.state})"
    return "gone without an ending" if holder is not None else "not started"


def list_runs(out_dir: Path) -> int:
    """``srl status`` without a run directory: a table of the runs under ``out_dir`` (:func:`run_dirs`) and the
    sweeps there, with name, state (:func:`run_state`), trainer step (of ``max_steps``) and the orchestrator's
    newest mean reward. Returns 0, or 1 (with a sentence) when there is nothing to list."""
    from . import sweeps
    from .progress import last_metrics

    runs = run_dirs(out_dir)
    try:
        sweep_roots = sorted(p for p in out_dir.iterdir() if sweeps.is_sweep_root(p) and (p / "arrays.jsonl").exists())
    except OSError:
        sweep_roots = []
    if not runs and not sweep_roots:
        where = f"{out_dir} does not exist" if not out_dir.exists() else f"no runs under {out_dir}"
        print(
            f"srl status: {where}; give a run directory (srl status outputs/<run name>) or the output directory "
            "with --output-dir",
            file=sys.stderr,
        )
        return 1
    rows = [("run", "state", "step", "reward")]
    for root in runs:
        run = RunDir(root)
        last = last_metrics(run)
        step = last.get("trainer", {}).get("step")
        top = resolved_max_steps(run)
        reward = last.get("orchestrator", {}).get("reward/all/mean")
        rows.append(
            (
                root.name,
                run_state(run),
                "-" if step is None else f"{step}" + (f"/{top}" if top else ""),
                f"{reward:.4f}" if isinstance(reward, (int, float)) else "-",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    print(f"runs under {out_dir} (details: srl status {out_dir}/<run>):")
    for r in rows:
        print("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[3])
    for root in sweep_roots:
        print(f"  sweep {root.name}: srl status {root}")
    return 0


def _dependency_note(st: Any) -> str | None:
    """A sentence for a job held or cancelled by its dependency (``srl sft chain``: RL behind SFT), else None."""
    reason = st.reason or ""
    if st.state == "PENDING" and reason == "Dependency":
        return "waiting for the job it depends on (e.g. the SFT job of an srl sft chain) to complete"
    if reason == "DependencyNeverSatisfied":
        return (
            "the job it depends on did not complete successfully (e.g. the SFT job of an srl sft chain "
            "failed), so Slurm "
            + ("cancelled this job; nothing of it ran" if st.state == "CANCELLED" else "will never start it")
        )
    return None


def cancel_main(args: list[str]) -> int:
    """Cancel every job of the run that is not final. ``--graceful`` first writes the stop request so the
    trainer checkpoints, waits ``--grace`` seconds, then cancels."""
    ap = _parser("cancel")
    ap.add_argument("--graceful", action="store_true")
    ap.add_argument("--grace", type=_grace_seconds, default=300.0)
    a = ap.parse_args(args)
    from . import sweeps

    if sweeps.is_sweep_root(a.run_dir):
        # Every array of the sweep; running points checkpoint first (their stop request), within --grace.
        return sweeps.cancel_main(a.run_dir, grace_s=a.grace)
    run = RunDir(a.run_dir)
    gate_jobs = _gate_job_ids(run)
    trained = run.configs.is_dir()  # else only a gate ran here
    if not trained and not gate_jobs:
        # As srl status: a file (its lease path is no path) or a directory that is no run has nothing to cancel.
        print(_not_a_run(run), file=sys.stderr)
        return 1
    jobs = read_job_ids(run) if trained else []
    holder = leases.read(run) if trained else None
    if holder is not None and not holder.job_id and holder.dead_reason() is None:
        rc = _cancel_local(run, holder)
        if rc == 0:  # the run is stopping: its gate jobs go too (never when the run could not be stopped)
            _cancel_jobs(slurm.live_jobs(gate_jobs))
        return rc
    if not jobs and not gate_jobs:
        print(f"{run.root}: no Slurm job recorded and no live local supervisor", file=sys.stderr)
        return 1
    live = slurm.live_jobs(job_id for job_id, _, _ in jobs)
    # A run's gate jobs go with it: a gate that passes after the run was cancelled would only start training
    # chained behind it (--chain-before) that the user meant to stop, or judge a run nobody waits for.
    live_gates = slurm.live_jobs(gate_jobs)
    # First, before any grace: a gate has nothing to checkpoint, and one passing during the wait would start the
    # training chained behind it.
    _cancel_jobs(live_gates)
    if a.graceful and live:
        run.control.mkdir(parents=True, exist_ok=True)
        run.stop_request.touch()
        deadline = time.monotonic() + a.grace
        while time.monotonic() < deadline and any(not slurm.job_state(j).is_terminal for j in live):
            time.sleep(1.0)
    _cancel_jobs(live)
    if not live and not live_gates:
        print("no running or pending job")
        return 0
    # The same command with its overrides, so a resume does not silently fall back to the job file's values.
    command = continue_command_for(run) if live else None
    if command and not run.gate_spec().exists():  # a first-run gate's job has nothing to continue
        print(f"continue it (from its newest complete checkpoint) with:\n  {command}")
    return 0


def _gate_job_ids(run: RunDir) -> list[str]:
    """The Slurm job ids of ``run``'s first-run gate jobs (``<run>/eval/<command>``), oldest first per command."""
    from ..run.verdict import GATE_STEMS

    return [job_id for command in GATE_STEMS for job_id, _, _ in read_job_ids(run.gate_run(command))]


def _cancel_jobs(job_ids: list[str]) -> None:
    """``scancel`` each job, saying so."""
    for job_id in job_ids:
        slurm.cancel(job_id)
        print(f"cancelled {job_id}")


def _cancel_local(run: RunDir, holder: leases.Holder) -> int:
    """Stop a run supervised by a local launcher (the lease holder): SIGTERM asks it to checkpoint and stop, as
    Ctrl-C does. Only possible from the holder's host; elsewhere, say where it runs. Returns the exit status."""
    if holder.host != socket.gethostname():
        print(
            f"{run.root} is run by {holder.describe()}; stop it on host {holder.host} "
            f"(srl cancel {run.root} there, or Ctrl-C in its terminal)",
            file=sys.stderr,
        )
        return 1
    if holder.pid_start is None or holder.pid <= 1:
        # Without the start time the PID cannot be told from a later process that reused it (or from init, in a
        # hand-edited record): signalling it could stop something that is not srl.
        print(
            f"{run.root}: its lease names pid {holder.pid} without the process's start time, so srl cannot "
            f"confirm that pid {holder.pid} is the launcher; stop it in its terminal (Ctrl-C) or check "
            f"`ps -p {holder.pid}` and signal it yourself",
            file=sys.stderr,
        )
        return 1
    try:
        os.kill(holder.pid, signal.SIGTERM)
    except ProcessLookupError:
        print("no running supervisor (it ended just now)")
        return 0
    print(f"asked the launcher (pid {holder.pid}) to checkpoint and stop; it prints how to continue the run")
    return 0


def _log_files(run: RunDir, role: str | None) -> list[Path]:
    base = run.latest_logs if run.latest_logs.exists() else run.logs
    files = sorted(base.glob(f"{role}*.log" if role else "*.log"))
    if role is None:
        files = sorted(run.logs.glob("*.out")) + files
    return [f for f in files if f.is_file()]  # a directory named like a log has no lines to print


def run_is_live(run: RunDir) -> bool:
    """Whether more may still be written to ``run``'s logs: a live supervisor holds its lease, or a Slurm job of
    it is not final (queued, starting, requeued). When Slurm cannot be asked, it may be: True."""
    holder = leases.read(run)
    if holder is not None and holder.dead_reason() is None:
        return True
    jobs = read_job_ids(run)
    if not jobs:
        return False
    try:
        return bool(slurm.live_jobs(job_id for job_id, _, _ in jobs))
    except slurm.SlurmCommandError:
        return True


def logs_main(args: list[str]) -> int:
    """Print the run's logs (batch log + per-process logs of the latest attempt), or one role's with ``--role``;
    ``--follow`` keeps printing new lines until the run has ended (:func:`run_is_live`: its last lines are
    printed, then how it ended) or until interrupted."""
    ap = _parser("logs")
    ap.add_argument(
        "--role", choices=("inference", "prefill", "decode", "router", "teacher", "trainer", "orchestrator")
    )
    ap.add_argument("--follow", "-f", action="store_true")
    a = ap.parse_args(args)
    run = RunDir(a.run_dir)
    files = _log_files(run, a.role)
    if not files:
        print(f"no logs under {run.logs}", file=sys.stderr)
        return 1
    offsets: dict[Path, int] = {}
    last_round = False
    while True:
        # Decided before reading, so the lines written up to the run's end are read in this round.
        last_round = a.follow and not run_is_live(run)
        for f in _log_files(run, a.role):
            pos = offsets.get(f, 0)
            try:
                with open(f, "rb") as fh:
                    fh.seek(pos)
                    chunk = fh.read()
            except OSError:  # removed since it was listed (a run directory cleaned while followed)
                continue
            if chunk:
                if len(files) > 1 or a.follow:
                    for line in chunk.decode(errors="replace").splitlines():
                        print(f"[{f.name}] {line}")
                else:
                    sys.stdout.write(chunk.decode(errors="replace"))
                offsets[f] = pos + len(chunk)
        if not a.follow:
            return 0
        if last_round:
            end = ending.read(run)
            print("srl logs: the run has ended" + (f": {end.summary()}" if end else ""), file=sys.stderr)
            return 0
        time.sleep(1.0)
