"""The rendered rl.sbatch on the real local Slurm cluster, every component replaced by a probe (probe/probe.py).

Checks: recorded placement equals placement.json; killing one component ends the whole job within seconds with a
non-zero state; the pre-timeout signal checkpoints (probe marker) and requeues, the job runs again with
SLURM_RESTART_COUNT=1 and its earlier batch log is kept. A probe accepts any argv, so the tests that place every
kind of component (aggregated and prefill/decode engines, router, torchrun and single-process trainer,
orchestrator) also hand each argv a probe received to the real program's own parser (tests/argv_checks.py: vLLM's,
torchrun's, vllm-router's, srl's roles'): a command line the real program would refuse fails here.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from run_records import error_lines, processes_left

from analysis.diagnose import diagnose
from toolkit.config import load_config
from toolkit.launch import slurm
from toolkit.launch.prepare import prepare_run
from toolkit.launch.submit import submit_job
from toolkit.placement import read_plan, visible_devices

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

REPO = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).resolve().parent / "probe" / "probe.py"
# Waits for what the job records (probe records, log lines, Slurm states) are generous (minutes): slurmctld, slurmd
# and the probes act late on two busy cores, and a bound only ends a wait that would otherwise never end.
WAIT_S = 300
# A trainer probe that runs until the job stops it (the stop request or a signal), not out of its own time during
# the waits above.
UNTIL_STOPPED_S = 3600


def _probe_bin(tmp: Path) -> Path:
    bindir = tmp / "probe-bin"
    bindir.mkdir()
    for name in ("python", "srl", "torchrun", "vllm-router"):
        p = bindir / name
        p.write_text(f'#!/bin/sh\nexec {sys.executable} {PROBE} "$@"\n')
        p.chmod(0o755)
    return bindir


def _site_dir(tmp: Path, bindir: Path) -> Path:
    sites = tmp / "sites"
    sites.mkdir()
    text = (REPO / "site-configs" / "local-slurm.toml").read_text()
    text = text.replace('name = "local-slurm"', 'name = "probe-slurm"')
    text, n = re.subn(r"(?m)^python = .*$", f'python = "python"\nsetup = ["export PATH={bindir}:$PATH"]', text)
    assert n == 1, "local-slurm.toml must set [environment] python once"
    (sites / "probe-slurm.toml").write_text(text)
    return sites


def _config(
    tmp: Path,
    name: str,
    extra: str = "",
    train_nodes: int = 2,
    orchestrator: str = "with_inference",
    tail: str = "",
    infer_nodes: int = 1,
) -> Path:
    model = tmp / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(
        "{}"
    )  # a HF-format directory as far as config validation looks; probes never load it
    path = tmp / f"{name}.toml"
    path.write_text(f"""
output_dir = "{tmp / "out"}"
site = "probe-slurm"
[run]
name = "{name}"
[model]
name = "{model}"
[[orchestrator.train.env]]
taskset = {{ id = "srl-reverse-text" }}
[inference.vllm]
tensor_parallel_size = 2
[deployment]
type = "multi_node"
gpus_per_node = 4
num_infer_nodes = {infer_nodes}
num_train_nodes = {train_nodes}
orchestrator = "{orchestrator}"
[slurm]
checkpoint_grace_s = 10
signal_lead_s = 60
{extra}
{tail}
""")
    return path


@pytest.fixture
def probe_run(tmp_path, monkeypatch):
    bindir = _probe_bin(tmp_path)
    monkeypatch.setenv("SRL_SITE_CONFIGS", str(_site_dir(tmp_path, bindir)))

    def make(name: str, trainer_seconds: float, extra: str = "", **kw):
        loaded = load_config([_config(tmp_path, name, extra, **kw)])
        run, attempt = prepare_run(loaded, argv=["srl", "rl"])
        (run.root / "probe").mkdir()
        (run.root / "probe" / "trainer_seconds").write_text(str(trainer_seconds))
        return loaded.config, run, attempt

    return make


def _records(run) -> dict[tuple[str, str, str], dict]:
    out = {}
    for f in (run.root / "probe").glob("*.json"):
        rec = json.loads(f.read_text())
        out[(rec["process"], rec["node"], rec["env"].get("SLURM_RESTART_COUNT", "0"))] = rec
    return out


def _wait_records(run, n: int, timeout_s: float, restart: str = "0") -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        recs = {k: v for k, v in _records(run).items() if k[2] == restart}
        if len(recs) >= n:
            return recs
        time.sleep(0.2)
    raise AssertionError(
        f"only {sorted(_records(run))} probe records after {timeout_s} s; batch log:\n{_batch_log(run)}"
    )


def _batch_log(run) -> str:
    return "\n".join(p.read_text() for p in sorted(run.logs.glob("*.out")))


def _wait_log(run, pattern: str, timeout_s: float, path: Path | None = None) -> re.Match:
    """The first match of ``pattern`` in the batch log (or in the file ``path``), polled until it is written."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = _batch_log(run) if path is None else (path.read_text() if path.exists() else "")
        m = re.search(pattern, text)
        if m:
            return m
        time.sleep(0.2)
    raise AssertionError(
        f"no {pattern!r} in {path or 'the batch log'} after {timeout_s} s; batch log:\n{_batch_log(run)}"
    )


def _assert_real_parsers_accept(run) -> None:
    """Each distinct command line the probes of ``run`` received (placeholders expanded by the job), under the name
    of the program the plan starts (the probe's own argv[0] is probe.py), is accepted by that program's parser."""
    from argv_checks import assert_argvs_accepted

    plan = read_plan(run)
    argvs = {}
    for rec in _records(run).values():
        argv = [plan.process(rec["process"]).command[0], *rec["argv"][1:]]
        argvs[json.dumps(argv)] = argv
    assert_argvs_accepted(list(argvs.values()))


def _expected_records(plan) -> int:
    return sum(p.num_nodes for p in plan.processes)


def test_dry_run_writes_the_placement_the_job_runs(tmp_path, monkeypatch):
    # The login node decides ports and roles once: the job only adds its id and the hosts Slurm gave it.
    from plan_checks import without_job

    from toolkit.cli import main
    from toolkit.launch.submit import read_job_ids
    from toolkit.run.layout import RunDir

    monkeypatch.setenv("SRL_SITE_CONFIGS", str(_site_dir(tmp_path, _probe_bin(tmp_path))))
    cfg = _config(tmp_path, "plan3")
    assert main(["rl", "@", str(cfg), "--dry-run"]) == 0
    run = RunDir(tmp_path / "out" / "plan3")
    dry = json.loads(run.placement_file.read_text())
    assert main(["rl", "@", str(cfg)]) == 0  # takes the dry-run directory over and submits
    job = read_job_ids(run)[-1][0]
    st = slurm.wait(job, timeout_s=90)
    assert st.state == "COMPLETED", _batch_log(run)
    ran = json.loads(run.placement_file.read_text())
    assert ran["job_id"] == job and len(ran["hosts"]) == 3
    assert without_job(ran) == without_job(dry, job_id=job)


def test_recorded_placement_equals_plan(probe_run, capsys):
    from toolkit.launch.control import logs_main, status_main

    cfg, run, attempt = probe_run("place3", trainer_seconds=4)
    job = submit_job(cfg, run, attempt)
    st = slurm.wait(job, timeout_s=90)
    assert st.state == "COMPLETED" and st.exit_code == 0, _batch_log(run)
    # A clean finish: the engines and the router still serving were stopped through Slurm (SIGINT to the engines',
    # SIGTERM to the router's tasks, which end with status 0), not by srun's SIGTERM, which SIGKILLs them and logs
    # "srun: error: ... Killed".
    assert error_lines(_batch_log(run)) == [], _batch_log(run)
    assert processes_left(run.root) == []
    capsys.readouterr()
    assert status_main([str(run.root)]) == 0
    status = capsys.readouterr().out
    assert f"{job}\trl\tattempt {attempt}\tCOMPLETED" in status  # scontrol, no sacct
    # srl's teardown wrote control/STOP for the steps still running; with the job final that is not news.
    assert run.stop_request.exists() and "stop requested" not in status
    # The router's log says CANCELLED (slurmstepd writes it for a SIGTERM sent to a step), but srl stopped it:
    # diagnose must not report a cancel.
    cancelled = [p.name for p in run.logs.rglob("*.log") if re.search(rf"STEP {job}\.\d+ .*CANCELLED", p.read_text())]
    assert cancelled, "no step of the job was stopped by srl: the diagnose check below tests nothing"
    assert not [name for name in cancelled if name.startswith("inference")], cancelled  # SIGINT: no such line
    assert [f.boundary for f in diagnose(run) if f.boundary.startswith("Slurm")] == []
    assert logs_main([str(run.root), "--role", "trainer"]) == 0
    out = capsys.readouterr().out
    assert "[trainer-0.log] probe trainer" in out and "[trainer-1.log] probe trainer" in out
    plan = read_plan(run)
    assert plan.job_id == job and len(plan.hosts) == 3
    recs = _records(run)
    assert len(recs) == _expected_records(plan) == 6  # 2 engines + router + orchestrator on node 0, trainer on 1-2
    for p in plan.processes:
        for i in p.node_indices:
            rec = recs[(p.name, plan.hosts[i], "0")]
            assert rec["node_index"] == str(i)
            assert rec["cuda_visible_devices"] == visible_devices(p.gpus, "0,1,2,3", 4)
            assert rec["env"]["SRL_JOB_ID"] == job
            for port in p.ports.values():
                assert str(port) in " ".join(rec["argv"]) + " ".join(rec["env"].values())
            for k, v in p.env.items():
                if k.startswith("SRL_") and "{" not in v:
                    assert rec["env"][k] == v
    trainer = plan.process("trainer")
    rec = recs[("trainer", plan.hosts[trainer.node_index], "0")]
    assert rec["env"]["MASTER_ADDR"] == plan.addresses[plan.master_node]
    assert f"{plan.addresses[plan.master_node]}:{trainer.ports['rdzv']}" in rec["argv"]
    assert "/srl-" + job + "/triton" in rec["env"]["TRITON_CACHE_DIR"]
    _assert_real_parsers_accept(run)


# An engine is restarted by default (inference.max_restarts, tests/integration/test_faults_engine_restart_sbatch.py);
# with restarts off its death ends the job like any other component's.
@pytest.mark.parametrize(
    ("name", "victim_name", "extra"),
    [
        ("kill3", "orchestrator", ""),
        ("kill4", "inference-0-0", "[inference]\nmax_restarts = 0"),
    ],
)
def test_killing_one_component_ends_the_job(probe_run, name, victim_name, extra):
    # The trainer runs until stopped, so only the victim's death can end this job.
    cfg, run, attempt = probe_run(name, trainer_seconds=UNTIL_STOPPED_S, extra=extra)
    job = submit_job(cfg, run, attempt)
    recs = _wait_records(run, 6, WAIT_S)
    victim = next(r for k, r in recs.items() if k[0] == victim_name)
    t0 = time.monotonic()
    os.kill(victim["pid"], signal.SIGKILL)
    # Timed up to the supervisor's own record that it saw the death, not to slurmctld's state (which lags on a
    # busy machine): it polls its steps every 0.5 s, so even a loaded machine records it well within the bound.
    _wait_log(run, re.escape(f"teardown: {victim_name} exited first (status"), WAIT_S)
    noticed = time.monotonic() - t0
    assert noticed < 60, f"the supervisor took {noticed:.1f} s to notice that {victim_name} died"
    # No other component ends on its own (trainer: UNTIL_STOPPED_S; engines, router, orchestrator: never): a job
    # that is not torn down outlives this wait.
    st = slurm.wait(job, timeout_s=WAIT_S)
    assert st.state == "FAILED", (st, _batch_log(run))
    assert st.exit_code not in (None, 0)
    findings = {f.boundary: f for f in diagnose(run)}
    assert f"teardown: {victim_name} exited first (status" in findings["Slurm: component failed"].evidence["excerpt"]
    assert "Slurm: cancelled" not in findings  # srl stopped the other steps; nobody cancelled the job


def test_signal_checkpoints_and_requeues(probe_run):
    cfg, run, attempt = probe_run("sig3", trainer_seconds=UNTIL_STOPPED_S)
    job = submit_job(cfg, run, attempt)
    _wait_records(run, 6, WAIT_S)
    (run.root / "probe" / "trainer_seconds").write_text("3")  # read by the second run's trainer probe
    subprocess.run(["scancel", "--batch", "--signal=USR2", job], check=True, timeout=30)
    recs = _wait_records(run, 6, WAIT_S, restart="1")
    assert (run.checkpoints / "step_1" / "COMPLETE").exists()
    st = slurm.wait(job, timeout_s=WAIT_S)
    assert st.state == "COMPLETED", _batch_log(run)
    assert st.restart_count == 1
    assert all(r["env"]["SLURM_RESTART_COUNT"] == "1" for r in recs.values())
    log = _batch_log(run)
    assert "received SIGUSR2" in log and "restart 0" in log and "restart 1" in log  # first run's log kept
    assert "Slurm: cancelled" not in [f.boundary for f in diagnose(run)]  # srl stopped its steps to requeue


def test_srl_cancel_stops_the_job_and_prints_how_to_continue(probe_run, capsys):
    from toolkit.launch.control import cancel_main, status_main

    cfg, run, attempt = probe_run("cancel3", trainer_seconds=UNTIL_STOPPED_S)
    job = submit_job(cfg, run, attempt)
    _wait_records(run, 6, WAIT_S)
    capsys.readouterr()
    assert cancel_main([str(run.root)]) == 0
    out = capsys.readouterr().out
    assert f"cancelled {job}" in out
    assert f"srl rl --run.name {run.root.name} --resume" in out  # the recorded command (here "srl rl"), resuming
    st = slurm.wait(job, timeout_s=WAIT_S)
    assert st.state == "CANCELLED", (st, _batch_log(run))
    assert status_main([str(run.root)]) == 0
    assert f"{job}\trl\tattempt {attempt}\tCANCELLED" in capsys.readouterr().out
    assert "Slurm: cancelled" in [f.boundary for f in diagnose(run)]  # a user's cancel stays one


def test_hetjob_orchestrator_on_its_own_node(probe_run):
    # 1 inference + 1 trainer node in group 0, the orchestrator alone in het group 1
    cfg, run, attempt = probe_run(
        "het", trainer_seconds=3, train_nodes=1, orchestrator='own_node"\norchestrator_partition = "debug'
    )
    job = submit_job(cfg, run, attempt)
    st = slurm.wait(job, timeout_s=90)
    assert st.state == "COMPLETED", _batch_log(run)
    plan = read_plan(run)
    assert [g.num_nodes for g in plan.groups] == [2, 1] and len(plan.hosts) == 3
    recs = _records(run)
    orch = plan.process("orchestrator")
    assert orch.het_group == 1
    rec = recs[("orchestrator", plan.hosts[orch.node_index], "0")]
    assert rec["cuda_visible_devices"] == ""  # CPU component
    assert rec["node"] not in {plan.hosts[i] for p in plan.processes if p.het_group == 0 for i in p.node_indices}
    for p in plan.processes:
        for i in p.node_indices:
            assert (p.name, plan.hosts[i], "0") in recs
    _assert_real_parsers_accept(run)


def test_prefill_decode_placement_and_its_command_lines(probe_run):
    # One prefill and one decode engine (ExampleConnector) behind the router in P/D mode, 2 trainer nodes: the
    # whole 4-node cluster. Engines get a --kv-transfer-config JSON that vLLM validates on parsing.
    pd = (
        '[inference.deployment]\ntype = "disaggregated"\nnum_prefill_replicas = 1\nprefill_nodes_per_replica = 1\n'
        'num_decode_replicas = 1\ndecode_nodes_per_replica = 1\nkv_connector = "ExampleConnector"\n'
    )
    cfg, run, attempt = probe_run("pd", trainer_seconds=3, infer_nodes=2, tail=pd)
    job = submit_job(cfg, run, attempt)
    st = slurm.wait(job, timeout_s=120)
    assert st.state == "COMPLETED", _batch_log(run)
    plan = read_plan(run)
    recs = _records(run)
    assert len(recs) == _expected_records(plan) and len(set(plan.hosts)) == 4, (sorted(recs), plan.hosts)
    kv = {p.kv_role: p for p in plan.processes if p.role == "inference"}
    assert sorted(kv) == ["kv_consumer", "kv_producer"] and kv["kv_producer"].node_index != kv["kv_consumer"].node_index
    router = recs[("router", plan.hosts[plan.process("router").node_index], "0")]
    assert "--vllm-pd-disaggregation" in router["argv"]
    _assert_real_parsers_accept(run)


def test_two_allocations_inference_job_then_rl_job(probe_run, tmp_path):
    icfg, irun, iattempt = probe_run("serve", trainer_seconds=3)
    ijob = submit_job(icfg, irun, iattempt, "inference")
    try:
        cfg, run, attempt = probe_run("uses-serve", trainer_seconds=3, tail=f'[inference]\nexternal = "{irun.root}"\n')
        job = submit_job(cfg, run, attempt)
        st = slurm.wait(job, timeout_s=120)
        assert st.state == "COMPLETED", _batch_log(run) + _batch_log(irun)
        ready = json.loads(irun.inference_ready.read_text())
        iplan = read_plan(irun)
        assert ready["base_url"] == f"http://{iplan.addresses[0]}:{iplan.ports['router.http']}"
        assert len(ready["engine_urls"]) == 2 and ready["job_id"] == ijob
        plan = read_plan(run)
        assert {p.role for p in plan.processes} == {"trainer", "orchestrator"}
        recs = _records(run)
        orch = recs[("orchestrator", plan.hosts[plan.process("orchestrator").node_index], "0")]
        assert orch["env"]["SRL_INFERENCE_RUN_DIR"] == str(irun.root)
        _assert_real_parsers_accept(irun)  # the inference job's engines and router
        assert slurm.job_state(ijob).state == "RUNNING"  # the deployment outlives the RL job
    finally:
        slurm.cancel(ijob)
