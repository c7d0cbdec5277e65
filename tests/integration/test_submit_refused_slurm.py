"""sbatch refuses the job (here: the controller cannot be reached, injected with an `sbatch` on PATH that fails as
Slurm's does; squeue, sinfo and the rest are the real local cluster's): `srl rl` says so in one message without a
traceback, exits 1, and the attempt counts as having launched nothing, so the same command run again is not told
to --resume a run that never ran; once sbatch works, it submits into the same run directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from toolkit.launch.prepare import only_dry_runs
from toolkit.run.layout import RunDir

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.slurm]


def _srl(tmp_path: Path, env: dict) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "toolkit.cli",
        "rl",
        "@",
        "jobs/reverse-text/rl.toml",
        "@",
        "jobs/reverse-text/slurm.toml",
        "--output-dir",
        str(tmp_path),
        "--run.name",
        "refused",
    ]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=300, check=False)


def test_a_refused_submission_is_one_message_and_the_same_command_retries(tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sbatch").write_text(
        "#!/bin/sh\necho 'sbatch: error: Batch job submission failed: Unable to contact "
        "slurm controller (connect failure)' >&2\nexit 1\n"
    )
    (fake / "sbatch").chmod(0o755)
    refusing = {**os.environ, "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}"}
    run = RunDir(tmp_path / "refused")
    for _ in range(2):  # the second time is the same command, not a --resume
        r = _srl(tmp_path, refusing)
        assert r.returncode == 1, r.stdout + r.stderr
        assert "Slurm did not take the job" in r.stderr and "Unable to contact slurm controller" in r.stderr
        assert "Traceback" not in r.stderr and "already exists" not in r.stderr, r.stderr
        assert only_dry_runs(run) and not run.job_ids_file.exists()
    r = _srl(tmp_path, dict(os.environ))
    try:
        assert r.returncode == 0 and "submitted job" in r.stdout, r.stdout + r.stderr
    finally:
        job_ids = run.job_ids_file.read_text().split() if run.job_ids_file.exists() else []
        if job_ids:
            subprocess.run(["scancel", job_ids[0]], check=False)


@pytest.mark.parametrize(
    ("extra", "field", "text"),
    [
        (
            ["--slurm.partition", "nosuch"],
            "slurm.partition",
            "partition 'nosuch' does not exist on this cluster; partitions: debug",
        ),
        (
            ["--deployment.num-train-nodes", "4"],
            "deployment",
            "the job needs 5 nodes in partition 'debug', which has at most 4 (nodes in it)",
        ),
        (
            ["--deployment.gpus-per-node", "8"],
            "deployment.gpus_per_node",
            "8 GPUs per node requested but no node of partition 'debug' has more than 4 (GRES gpu)",
        ),
    ],
)
def test_a_job_its_partition_can_never_run_is_refused_before_anything_is_written(tmp_path, extra, field, text):
    # The real cluster's answer (scontrol/sinfo: one partition 'debug' of 4 nodes with 4 GPUs each) against a site
    # file that does not know the cluster's limits (no limits.max_nodes, 8 GPUs per node): the dry run refuses
    # first, the same as a submission; nothing is written.
    sites = tmp_path / "sites"
    sites.mkdir()
    text_site = (ROOT / "site-configs" / "local-slurm.toml").read_text()
    (sites / "local-slurm.toml").write_text(
        text_site.replace("max_nodes = 4", "").replace("gpus_per_node = 4", "gpus_per_node = 8")
    )
    env = {**os.environ, "SRL_SITE_CONFIGS": str(sites)}
    for dry in (["--dry-run"], []):
        cmd = [
            sys.executable,
            "-m",
            "toolkit.cli",
            "rl",
            "@",
            "jobs/reverse-text/rl.toml",
            "@",
            "jobs/reverse-text/slurm.toml",
            "--output-dir",
            str(tmp_path),
            "--run.name",
            "too-big",
            *extra,
            *dry,
        ]
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False, env=env)
        assert r.returncode == 2, r.stdout + r.stderr
        assert f"- {field} " in r.stderr and text in r.stderr, r.stderr
        assert not (tmp_path / "too-big").exists()
