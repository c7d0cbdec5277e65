"""What integration tests read from a run they started: its metrics lines and the steps each role recorded, the
`srl rl` submission of the reverse-text job to the local Slurm cluster, the error lines of a batch job's log, the
processes of a run still alive on this machine, and an `srl` command started in the background and stopped as Ctrl-C
would.

Readers tolerate a run still being written: a missing file is no lines, a torn last line is skipped. Steps come
back in file order with repeats kept, so a test can assert that every step was recorded exactly once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from toolkit.launch.submit import read_job_ids
from toolkit.run.layout import RunDir
from toolkit.run.metrics import EVAL_POLICY_VERSION

ROOT = Path(__file__).resolve().parents[1]
SLURM_JOB = [str(ROOT / "jobs/reverse-text/rl.toml"), str(ROOT / "jobs/reverse-text/slurm.toml")]


def metrics_lines(run_root: Path) -> list[dict]:
    """Every complete JSON line of ``<run_root>/metrics.jsonl`` (none when the file does not exist yet)."""
    try:
        text = (Path(run_root) / "metrics.jsonl").read_text()
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line being appended
    return out


def served_version(run_root: Path, version: int) -> str:
    """What an engine reports (``/weight_info``, reload records) for policy ``version`` of the run at ``run_root``:
    ``"<run id>:<version>"``."""
    from toolkit.inference.versions import format_version
    from toolkit.orchestrator.policy import run_identity

    return format_version(run_identity(RunDir(run_root)), version)


def is_final_eval_line(m: dict) -> bool:
    """Whether metrics line ``m`` is an eval's own line after step 0 (the final policy's eval, written at the last
    step beside that step's batch line): an eval record with no batch in it."""
    return m.get("step", 0) > 0 and EVAL_POLICY_VERSION in m and "effective_batch_size" not in m


def role_steps(run_root: Path, role: str, *, first: int = 0) -> list[int]:
    """Steps >= ``first`` of ``role``'s metrics lines, in file order, repeats kept (step 0 is the baseline eval);
    the final eval's own line is not a step's line (:func:`is_final_eval_line`)."""
    return [
        m["step"]
        for m in metrics_lines(run_root)
        if m.get("role") == role and m.get("step", -1) >= first and not is_final_eval_line(m)
    ]


def srl_run(*argv: str, cwd: Path = ROOT, timeout_s: float = 300) -> subprocess.CompletedProcess:
    """Run ``srl ARGV...`` (this interpreter's toolkit) to its end; returns the finished process, its output captured.
    Asserts the command succeeded (its output is the assertion message)."""
    proc = subprocess.run(
        [sys.executable, "-m", "toolkit.cli", *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def submit_slurm_rl(out: Path, name: str, *overrides: str, configs: tuple[str, ...] = SLURM_JOB) -> tuple[RunDir, str]:
    """Run `srl rl @ rl.toml @ slurm.toml` (``configs``, default the README job on the local cluster) into
    ``out/name`` with ``overrides``; returns the run directory and the id of the job it submitted. Asserts the command
    succeeded (its output is the assertion message)."""
    srl_run("rl", *[a for c in configs for a in ("@", c)], "--output-dir", str(out), "--run.name", name, *overrides)
    run = RunDir(out / name)
    return run, read_job_ids(run)[-1][0]


def error_lines(text: str) -> list[str]:
    """The lines of ``text`` (a batch job's log) that contain "error" in any case: srun's ``srun: error: node1: task
    0: Killed``, slurmstepd's, a traceback's last line..."""
    return [line for line in text.splitlines() if "error" in line.lower()]


def processes_of(run_root: Path) -> list[str]:
    """Command lines of the live processes on this machine (where every emulated node runs) whose command line names
    the run directory ``run_root`` or whose environment's ``SRL_RUN_DIR`` is it (each process srl starts for a run,
    engines included); zombies and this process are left out."""
    root = str(Path(run_root)).encode()
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if (d / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            cmdline = (d / "cmdline").read_bytes()
            env = (d / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError):
            continue  # gone meanwhile
        if root in cmdline or b"SRL_RUN_DIR=" + root in env:
            text = cmdline.replace(b"\0", b" ").decode(errors="replace")
            out.append(f"{d.name}: {text[:200]}")
    return out


def processes_left(run_root: Path, timeout_s: float = 30.0) -> list[str]:
    """:func:`processes_of` ``run_root`` once none is left, or what is still there after ``timeout_s`` seconds (a
    job's final state may come before its last process is reaped)."""
    deadline = time.monotonic() + timeout_s
    while (left := processes_of(run_root)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def srl_background(*argv: str, cwd: Path = ROOT) -> subprocess.Popen:
    """``srl ARGV...`` (this checkout's CLI) run in ``cwd`` in its own process group, as a user starts it, output
    captured as text (stdout and stderr together); stop it with :func:`stop_background`."""
    return subprocess.Popen(
        [sys.executable, "-m", "toolkit.cli", *argv],
        cwd=cwd,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def stop_background(p: subprocess.Popen, timeout_s: float = 300) -> str:
    """Ctrl-C (SIGINT to its process group) for a :func:`srl_background` command still running, then its output;
    SIGKILL after ``timeout_s`` seconds."""
    import signal

    if p.poll() is None:
        os.killpg(p.pid, signal.SIGINT)
    try:
        return p.communicate(timeout=timeout_s)[0]
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        return p.communicate()[0]
