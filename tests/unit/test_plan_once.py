"""The plan is decided once, on the login node: a dry run writes the placement a submission of the same run uses,
and the batch job only fills in its id and hosts (toolkit.launch.dispatch, toolkit.placement.runtime.resolve)."""

from __future__ import annotations

import json
from pathlib import Path

from plan_checks import without_job

from toolkit.cli import main
from toolkit.launch import slurm
from toolkit.placement import runtime
from toolkit.run.layout import RunDir

JOBS = Path(__file__).resolve().parents[2] / "jobs" / "reverse-text"


def _placement(run: Path) -> dict:
    return json.loads((run / "launcher" / "placement.json").read_text())


def test_dry_run_writes_the_plan_the_submitted_job_uses(tmp_path: Path, monkeypatch) -> None:
    args = ["rl", "@", str(JOBS / "rl.toml"), "@", str(JOBS / "slurm.toml"), "--site", "local-slurm",
            "--output-dir", str(tmp_path), "--run.name", "r"]  # fmt: skip
    assert main([*args, "--dry-run"]) == 0
    dry = _placement(tmp_path / "r")

    # Submit the same run (sbatch and squeue faked): the dry-run directory is taken over, the job queued.
    monkeypatch.setattr(slurm, "jobs_logging_under", lambda root: [])
    monkeypatch.setattr(slurm, "submit", lambda script, **kw: "4242")
    assert main(args) == 0
    submitted = _placement(tmp_path / "r")
    assert submitted == dry

    # The job starts on three emulated nodes: it keeps the login node's ports and roles, and adds its id and hosts.
    monkeypatch.setattr(runtime, "node_addresses", lambda hosts: [f"10.0.0.{i + 1}" for i in range(len(hosts))])
    started = runtime.resolve(RunDir(tmp_path / "r"), None, {"SLURM_JOB_ID": "4242",
                                                              "SLURM_JOB_NODELIST": "node[1-3]"})
    placed = _placement(tmp_path / "r")
    assert started.job_id == "4242" and placed["hosts"] == ["node1", "node2", "node3"]
    assert placed["ports"] == dry["ports"] and placed["roles"] == dry["roles"]
    assert without_job(placed) == without_job(dry, job_id="4242")
