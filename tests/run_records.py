"""What integration tests read from a run they started: its metrics lines and the steps each role recorded, and
the `srl rl` submission of the reverse-text job to the local Slurm cluster.

Readers tolerate a run still being written: a missing file is no lines, a torn last line is skipped. Steps come
back in file order with repeats kept, so a test can assert that every step was recorded exactly once.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from toolkit.launch.submit import read_job_ids
from toolkit.run.layout import RunDir

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


def role_steps(run_root: Path, role: str, *, first: int = 0) -> list[int]:
    """Steps >= ``first`` of ``role``'s metrics lines, in file order, repeats kept (step 0 is the baseline eval)."""
    return [m["step"] for m in metrics_lines(run_root) if m.get("role") == role and m.get("step", -1) >= first]


def submit_slurm_rl(out: Path, name: str, *overrides: str) -> tuple[RunDir, str]:
    """Run `srl rl @ rl.toml @ slurm.toml` into ``out/name`` with ``overrides``; returns the run directory and the
    id of the job it submitted. Asserts the command succeeded (its output is the assertion message)."""
    cmd = [sys.executable, "-m", "toolkit.cli", "rl", "@", SLURM_JOB[0], "@", SLURM_JOB[1], "--output-dir", str(out),
           "--run.name", name, *overrides]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run = RunDir(out / name)
    return run, read_job_ids(run)[-1][0]
