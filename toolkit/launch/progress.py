"""What a run has done so far, read from its run directory alone (``srl status``, local runs and Slurm runs alike).

The run directory is the one source every role writes to, so progress is read from it rather than from Slurm:
the last ``metrics.jsonl`` record of each role, the newest complete checkpoint, the newest STABLE weight broadcast,
a pending stop request, and for local runs the launcher record (``launcher/local.json``,
:mod:`toolkit.run.launcher`). Nothing here imports torch or vllm.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import time
from pathlib import Path
from typing import Any

from ..run import metrics
from ..run.launcher import read_local_record
from ..run.layout import RunDir


def last_metrics(run: RunDir) -> dict[str, dict[str, Any]]:
    """The last ``metrics.jsonl`` record of each role (``{"trainer": {...}, "orchestrator": {...}}``); eval-only
    records are skipped so the orchestrator's entry carries its reward. Empty when there are no metrics yet."""
    out: dict[str, dict[str, Any]] = {}
    for rec in metrics.tail(run.metrics):
        role = rec.get("role")
        if role and (role != metrics.ORCHESTRATOR or metrics.REWARD_MEAN in rec):
            out[role] = rec
    return out


def _number(value: Any, default: float) -> float:
    """``value`` as a float, ``default`` when it is missing or not a number (a damaged metrics line)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def file_size(path: Path) -> int:
    """Size of ``path`` in bytes; 0 when it does not exist or cannot be read."""
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _launcher_line(rec: dict[str, Any]) -> str:
    where = f"local launcher pid {rec.get('pid')} on {rec.get('host')}, attempt {rec.get('attempt')}"
    if "status" in rec:
        # What the status means is the run's ending line (``ending:``), recorded with it.
        return f"{where}: ended with status {rec['status']}"
    if rec.get("host") != socket.gethostname():
        return f"{where}: state unknown from this host"
    try:
        os.kill(int(rec["pid"]), 0)
    except (OSError, ValueError, KeyError):
        return f"{where}: gone without recording an exit (killed?)"
    return f"{where}: running"


def progress_lines(run: RunDir, *, max_steps: int | None = None, jobs_final: bool = False) -> list[str]:
    """Human-readable progress of ``run``, one fact per line; ``max_steps`` (from the resolved config) adds the
    target. ``jobs_final``: the caller knows every Slurm job of the run is final, so no attempt is running (a
    leftover stop request is then not news: srl's batch script writes one at every job's end). Never raises for a
    partial or missing run directory: missing facts are simply left out."""
    from ..checkpoints import latest_complete
    from ..run import ending
    from ..run.layout import newest_stable_broadcast

    lines: list[str] = []
    launcher = read_local_record(run)
    if launcher is not None:
        lines.append(_launcher_line(launcher))
    elif run.local_record.exists():
        lines.append(f"local launcher: unknown ({run.local_record} is unreadable or not a launcher record)")
    end = ending.read(run)
    if end is not None:
        lines.append(f"ended: {end.summary()} (exit status {end.exit_status})")
    elif run.ending.exists():
        # Left out silently, a cut-off or hand-edited record read as a run that never ended.
        lines.append(f"ended: unknown ({run.ending} is unreadable or not a run ending record)")
    last = last_metrics(run)
    now = time.time()
    of = f" of {max_steps}" if max_steps else ""
    if "trainer" in last:
        t = last["trainer"]
        age = now - _number(t.get("time"), now)
        lines.append(f"trainer: step {t.get('step')}{of}, last record {age:.0f} s ago")
    if "orchestrator" in last:
        o = last["orchestrator"]
        lines.append(
            f"orchestrator: step {o.get('step')}{of}, reward {_number(o['reward/all/mean'], float('nan')):.4f}"
        )
    if not last and file_size(run.metrics) and not metrics.tail(run.metrics):
        lines.append(f"no readable metrics: {run.metrics} holds no complete record (damaged?)")
    elif not last:
        lines.append("no metrics yet (starting, or never started)")
    ckpt = latest_complete(run)
    lines.append(f"newest complete checkpoint: {'step ' + str(ckpt) if ckpt is not None else 'none'}")
    stable = newest_stable_broadcast(run)
    if stable is not None:
        lines.append(f"newest published weights (STABLE): step {stable[0]}")
    # No running attempt to act on a leftover stop request: every job is final, the local launcher recorded its
    # exit, or the latest attempt recorded how it ended (each attempt clears that record when it starts; srl's
    # batch script writes a stop request at every job's end, so a finished run has one).
    ended = jobs_final or end is not None or (launcher is not None and "status" in launcher)
    if run.stop_request.exists() and not ended:
        lines.append("stop requested (control/STOP present): a running attempt checkpoints and stops")
    sync = wandb_sync_command(run)
    if sync:
        lines.append(f"W&B files saved offline; upload with: {sync}")
    return lines


def wandb_sync_command(run: RunDir) -> str | None:
    """``wandb sync DIR ...`` for the run's offline W&B directories (``[monitors.wandb]``, one per attempt, oldest
    first so the W&B run's history arrives in order), or None when there are none."""
    dirs = run.wandb_offline_runs()
    return ("wandb sync " + " ".join(shlex.quote(str(d)) for d in dirs)) if dirs else None


def resolved_max_steps(run: RunDir) -> int | None:
    """``max_steps`` of the latest attempt's resolved config, or None when unreadable."""
    try:
        return int(json.loads(run.resolved("rl").read_text())["max_steps"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def continue_command(argv: list[str], run_name: str) -> str:
    """The ready-to-paste command that resumes this run: ``argv`` (this ``srl rl`` invocation) with ``--run.name``
    set to ``run_name`` and ``--resume`` added, minus ``--clean`` (which would delete the run)."""
    # As the user typed it (e.g. .venv/bin/srl) when that was the srl script, else plain "srl".
    out: list[str] = [argv[0] if argv and Path(argv[0]).name == "srl" else "srl"]
    rest = iter(argv[1:])
    for tok in rest:
        if tok in ("--run.name", "--run-name"):
            next(rest, None)  # its value: replaced below by the actual run name
        elif tok != "--clean" and not tok.startswith(("--run.name=", "--run-name=")):
            out.append(tok)
    out += ["--run.name", run_name]
    if "--resume" not in out:
        out.append("--resume")
    return shlex.join(out)


def continue_command_for(run: RunDir) -> str | None:
    """:func:`continue_command` for the newest attempt of ``run``, from the command it recorded
    (``configs/attempt_<n>/command.txt``); None when no attempt recorded one."""
    attempts = run.attempts()
    if not attempts:
        return None
    try:
        argv = shlex.split((run.config_attempt(attempts[-1]) / "command.txt").read_text())
    except (OSError, ValueError):
        return None
    return continue_command(argv, run.root.name) if argv else None
