"""A dry run's batch script submitted by hand keeps its directory while the job waits in the real Slurm queue.

The directory holds nothing but dry-run files until the job starts, so only Slurm can tell that it is in use: the
next ``srl rl`` of the same name must refuse to take it over (naming the job) instead of deleting the files the
pending job will run from, and take it over once the job is gone.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from toolkit.launch import slurm

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "jobs" / "reverse-text" / "rl.toml"


def srl(*args):
    return subprocess.run(
        [sys.executable, "-m", "toolkit.cli", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )


def test_a_queued_job_from_a_dry_run_keeps_the_directory_until_it_is_cancelled(slurm_cluster, tmp_path):
    common = ("--output-dir", tmp_path, "--run.name", "r", "--site", "local-slurm")
    first = srl("rl", "@", JOB, "--dry-run", *common)
    assert first.returncode == 0, first.stderr
    script = tmp_path / "r" / "launcher" / "rl.sbatch"
    # Held: it stays pending for as long as the test needs, like a job waiting for a busy partition.
    job = slurm.submit(script, extra_args=("--hold",), cwd=tmp_path / "r")
    try:
        listed = slurm.jobs_logging_under(tmp_path / "r")
        assert listed and all(j.split("+")[0] == job for j in listed), (job, listed)  # a hetjob lists components
        assert slurm.jobs_logging_under(tmp_path / "elsewhere") == []
        again = srl("rl", "@", JOB, "--dry-run", *common)
        assert again.returncode != 0
        assert job in again.stderr and "queued or running" in again.stderr, again.stderr
        assert script.exists()  # nothing deleted
    finally:
        subprocess.run(["scancel", job], check=False, capture_output=True, timeout=30)
    slurm.wait(job, timeout_s=30)
    after = srl("rl", "@", JOB, "--dry-run", *common)
    assert after.returncode == 0, after.stderr
