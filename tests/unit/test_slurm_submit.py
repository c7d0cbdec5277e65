"""submit()/cancel() edge cases that the local cluster cannot produce, with a stand-in ``sbatch`` on PATH.

The single-cluster test cluster never prints a ``;cluster`` suffix or hangs; these stand-ins inject exactly
those outputs. Everything else about sbatch is tested on the real cluster (integration/test_slurm_jobs.py).
"""

from __future__ import annotations

import os
import stat

import pytest

from toolkit.launch import slurm


def _fake_bin(tmp_path, name: str, body: str) -> None:
    exe = tmp_path / name
    exe.write_text("#!/bin/bash\n" + body)
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def fake_path(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    return tmp_path


def test_submit_strips_cluster_suffix_and_warning_lines(fake_path):
    _fake_bin(fake_path, "sbatch", 'echo "sbatch: warning: something"\necho "4242;clusterA"\n')
    assert slurm.submit(fake_path / "job.sbatch") == "4242"


def test_submit_passes_args_and_scrubbed_env(fake_path, monkeypatch):
    out = fake_path / "seen.txt"
    _fake_bin(fake_path, "sbatch", f'echo "$@" > {out}\nenv >> {out}\necho 7\n')
    monkeypatch.setenv("SLURM_JOB_ID", "99")
    monkeypatch.setenv("SBATCH_PARTITION", "gpu")
    job = slurm.submit("run.sbatch", extra_args=["--dependency=afterok:5"], env={**os.environ, "X_KEEP": "1"})
    seen = out.read_text()
    assert job == "7"
    assert seen.splitlines()[0] == "--parsable --dependency=afterok:5 run.sbatch"
    assert "X_KEEP=1" in seen and "SLURM_JOB_ID" not in seen and "SBATCH_PARTITION" not in seen


def test_submit_without_job_id_is_an_error(fake_path):
    _fake_bin(fake_path, "sbatch", 'echo "Submitted batch job"\n')
    with pytest.raises(slurm.SubmitError, match="printed no job id"):
        slurm.submit("x.sbatch")


def test_submit_failure_carries_stderr(fake_path):
    _fake_bin(fake_path, "sbatch", 'echo "sbatch: error: Invalid account or account/partition" >&2\nexit 1\n')
    with pytest.raises(slurm.SubmitError) as ei:
        slurm.submit("x.sbatch")
    assert ei.value.returncode == 1
    assert "Invalid account" in str(ei.value) and "`sbatch --parsable x.sbatch`" in str(ei.value)


def test_hung_client_times_out_naming_the_command(fake_path):
    # exec: the timeout kills the stand-in itself, leaving no orphaned sleep behind.
    _fake_bin(fake_path, "scancel", "exec sleep 5\n")
    with pytest.raises(slurm.SlurmCommandError, match=r"`scancel 12` timed out after 0.3 s"):
        slurm.cancel("12", timeout_s=0.3)
