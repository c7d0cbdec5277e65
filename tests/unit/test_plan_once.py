"""The plan is decided once, on the login node: a dry run writes the placement a submission of the same run uses,
and the batch job only fills in its id and hosts (toolkit.launch.dispatch, toolkit.placement.runtime.resolve)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from plan_checks import without_job

from toolkit.cli import main
from toolkit.launch import slurm
from toolkit.placement import runtime
from toolkit.run.layout import RunDir

JOBS = Path(__file__).resolve().parents[2] / "jobs" / "reverse-text"


def _slurm_rl_args(out: Path) -> list[str]:
    """``srl rl`` of the README job on the local Slurm site, run ``r`` under ``out``."""
    jobs = ["@", str(JOBS / "rl.toml"), "@", str(JOBS / "slurm.toml")]
    return ["rl", *jobs, "--site", "local-slurm", "--output-dir", str(out), "--run.name", "r"]


def _placement(run: Path) -> dict:
    return json.loads((run / "launcher" / "placement.json").read_text())


def test_dry_run_writes_the_plan_the_submitted_job_uses(tmp_path: Path, monkeypatch) -> None:
    args = _slurm_rl_args(tmp_path)
    assert main([*args, "--dry-run"]) == 0
    dry = _placement(tmp_path / "r")

    # Submit the same run (sbatch and squeue faked): the dry-run directory is taken over, the job queued.
    monkeypatch.setattr(slurm, "jobs_logging_under", lambda root, **_kw: [])
    monkeypatch.setattr(slurm, "submit", lambda script, **kw: "4242")
    assert main(args) == 0
    submitted = _placement(tmp_path / "r")
    assert submitted == dry

    # The job starts on three emulated nodes: it keeps the login node's ports and roles, and adds its id and hosts.
    monkeypatch.setattr(runtime, "node_addresses", lambda hosts: [f"10.0.0.{i + 1}" for i in range(len(hosts))])
    run = RunDir(tmp_path / "r")
    started = runtime.resolve(
        run, *runtime.job_config(run, None), {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "node[1-3]"}
    )
    placed = _placement(tmp_path / "r")
    assert started.job_id == "4242" and placed["hosts"] == ["node1", "node2", "node3"]
    assert placed["ports"] == dry["ports"] and placed["roles"] == dry["roles"]
    assert without_job(placed) == without_job(dry, job_id="4242")


def _counting_build_plan(monkeypatch) -> list[str]:
    """Record the job id of every plan built from here on (every path to a plan goes through build_plan)."""
    from toolkit.placement import plan as plan_mod

    calls: list[str] = []
    real = plan_mod.build_plan

    def counted(*args, **kw):
        calls.append(str(kw.get("job_id")))
        return real(*args, **kw)

    monkeypatch.setattr(plan_mod, "build_plan", counted)
    return calls


def _sft_args(tmp_path: Path) -> list[str]:
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"p{i}", "completion": f"c{i}"}) + "\n" for i in range(8)))
    return ["sft", "@", str(JOBS / "sft.toml"), "--data.name", str(data), "--eval.env", "[]"]


@pytest.mark.parametrize("verb", ["rl", "sft", "inference"])
def test_one_slurm_launch_builds_its_plan_once(tmp_path: Path, monkeypatch, verb: str) -> None:
    """``srl rl``, ``srl sft`` and ``srl inference`` on a Slurm site, submitted (sbatch faked): the login node builds
    the plan once, in preflight, and that plan is the one written and submitted; a dry run builds it once too."""
    if verb == "rl":
        args = ["rl", "@", str(JOBS / "rl.toml"), "@", str(JOBS / "slurm.toml")]
    elif verb == "sft":
        args = _sft_args(tmp_path)
    else:
        args = ["inference", "@", str(JOBS.parent / "serve" / "tiny.toml")]
    args += ["--site", "local-slurm", "--output-dir", str(tmp_path / "out"), "--run.name", "r"]
    calls = _counting_build_plan(monkeypatch)
    assert main([*args, "--dry-run"]) == 0
    assert calls == ["$SLURM_JOB_ID"], calls
    scripts: list[str] = []
    monkeypatch.setattr(slurm, "jobs_logging_under", lambda root, **_kw: [])
    monkeypatch.setattr(slurm, "submit", lambda script, **kw: scripts.append(script) or "4243")
    calls.clear()
    assert main(args) == 0
    assert calls == ["$SLURM_JOB_ID"] and len(scripts) == 1, (calls, scripts)
    placed = _placement(tmp_path / "out" / "r")
    assert placed["job_id"] == "$SLURM_JOB_ID"
    assert (
        set(placed["roles"])
        == {
            "rl": {"inference", "router", "orchestrator", "trainer"},
            "sft": {"trainer"},
            "inference": {"inference", "router"},
        }[verb]
    )


def test_the_batch_job_reads_its_config_once_and_fills_in_the_plan(tmp_path: Path, monkeypatch) -> None:
    """Inside the batch job: the supervisor reads the resolved config and the site once (for resolve and for
    supervising), builds no plan (the login node's gets its id, hosts and model path), and a step's exec reads no
    config at all; each role then reads it once for itself (its own process)."""
    import toolkit.config
    from toolkit.config.site import read_site as real_read_site
    from toolkit.launch import supervisor

    args = _slurm_rl_args(tmp_path)
    monkeypatch.setattr(slurm, "jobs_logging_under", lambda root, **_kw: [])
    monkeypatch.setattr(slurm, "submit", lambda script, **kw: "4244")
    assert main(args) == 0
    login = _placement(tmp_path / "r")

    reads: list[str] = []
    real_load = toolkit.config.load_resolved
    monkeypatch.setattr(toolkit.config, "load_resolved", lambda path: reads.append(str(path)) or real_load(path))
    monkeypatch.setattr("toolkit.config.site.read_site", lambda path: reads.append(str(path)) or real_read_site(path))
    builds = _counting_build_plan(monkeypatch)
    monkeypatch.setattr(runtime, "node_addresses", lambda hosts: [f"10.0.0.{i + 1}" for i in range(len(hosts))])
    supervised: list = []
    monkeypatch.setattr(
        supervisor, "_supervise_job", lambda cfg, site, run, plan, *a, **kw: supervised.append((cfg, site, plan)) or 0
    )
    env = {**os.environ, "SLURM_JOB_ID": "4244", "SLURM_JOB_NODELIST": "node[1-3]"}
    assert supervisor.run_job(RunDir(tmp_path / "r"), attempt=None, kind="rl", env=env) == 0
    assert len(supervised) == 1 and builds == []
    assert [Path(r).name for r in reads] == ["rl.json", "site.toml"], reads
    placed = _placement(tmp_path / "r")
    assert placed["job_id"] == "4244" and placed["ports"] == login["ports"]
    assert placed["model_path"] and Path(placed["model_path"]).is_dir()
    assert without_job(placed) == without_job(login, job_id="4244")

    # A step of the job: fills in its command and environment from the plan alone.
    reads.clear()
    execs: list[list[str]] = []

    def fake_exec(path, argv, env):
        execs.append(argv)
        raise SystemExit(0)

    monkeypatch.setattr(os, "execvpe", fake_exec)
    engine = next(p["name"] for p in placed["processes"] if p["role"] == "inference")
    with pytest.raises(SystemExit):
        runtime.exec_process(RunDir(tmp_path / "r"), engine, {**env, "SLURMD_NODENAME": "node1"})
    assert reads == [] and placed["model_path"] in execs[0], execs
