"""Run rendered rl.sbatch scripts with bash and a stub ``srun`` that runs each step here: no launch without a host
list (a case the real cluster cannot produce: Slurm always sets it), the run lease, and shell-injection safety of
every value from the config down to the components' argv and environment. What needs Slurm's own behaviour runs on
the real cluster: test_rl_sbatch_slurm.py (signal, requeue, teardown), test_supervisor_slurm.py (pre-run command),
test_engine_restart_slurm.py (engine restarts).

The stub srun drops its own options and runs the step command here; every component is the probe
(``probe/probe.py``). Each test takes a few seconds (python start-ups), hence ``slow``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from toolkit import lease
from toolkit.config import load_config
from toolkit.launch.prepare import prepare_run
from toolkit.placement import build_plan, write_plan
from toolkit.preflight.site import load_site
from toolkit.render import render_job

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
PROBE = Path(__file__).resolve().parent / "probe" / "probe.py"

SRUN = """#!/bin/bash
echo "$*" >> "$STUB_LOG/srun.log"
while [[ $# -gt 0 && $1 == --* ]]; do shift; done
exec "$@"
"""
NODE = "NodeName=node1 Arch=x86_64 NodeAddr=127.0.0.1 NodeHostName=localhost"
SCONTROL = f"""#!/bin/bash
echo "$*" >> "$STUB_LOG/scontrol.log"
[[ $1 == requeue ]] && exit 0
[[ $1 == show && $2 == node ]] && {{ echo "{NODE}"; exit 0; }}
exit 1
"""


def _bin(tmp: Path) -> tuple[Path, Path]:
    stubs, probes = tmp / "stubs", tmp / "probes"
    stubs.mkdir()
    probes.mkdir()
    for name, body in (("srun", SRUN), ("scontrol", SCONTROL)):
        (stubs / name).write_text(body)
        (stubs / name).chmod(0o755)
    for name in ("python", "srl", "torchrun", "vllm-router"):
        (probes / name).write_text(f'#!/bin/sh\nexec {sys.executable} {PROBE} "$@"\n')
        (probes / name).chmod(0o755)
    return stubs, probes


def stub_site(tmp_path: Path, probes: Path, monkeypatch) -> None:
    """A site "stub" whose batch setup puts the probe programs first on PATH; srl reads it via SRL_SITE_CONFIGS."""
    sites = tmp_path / "sites"
    sites.mkdir()
    (sites / "stub.toml").write_text(
        f'name = "stub"\n[partitions]\ndefault = "debug"\n'
        f'[environment]\npython = "python"\nsetup = ["export PATH={probes}:$PATH"]\n'
    )
    monkeypatch.setenv("SRL_SITE_CONFIGS", str(sites))


@pytest.fixture
def stub_job(tmp_path, monkeypatch):
    stubs, probes = _bin(tmp_path)
    stub_site(tmp_path, probes, monkeypatch)

    def make(toml: str, output_dir: Path, trainer_seconds: float = 60):
        model = tmp_path / "model"
        model.mkdir(exist_ok=True)
        (model / "config.json").write_text("{}")  # HF-format dir for config validation; never loaded
        cfgfile = tmp_path / f"{uuid.uuid4().hex[:6]}.toml"
        cfgfile.write_text(
            f'output_dir = {json.dumps(str(output_dir))}\nsite = "stub"\n[model]\n'
            f'name = "{model}"\n[[orchestrator.train.env]]\ntaskset = {{ id = "srl-reverse-text" }}\n'
            f"[slurm]\ncheckpoint_grace_s = 5\nsignal_lead_s = 60\n" + toml
        )
        loaded = load_config([cfgfile])
        run, attempt = prepare_run(loaded, argv=["srl", "rl"])
        # Submission hands the run's lease over to the job (launch/submit.py); here the test runs the job itself.
        lease.held(run).release()
        site = load_site("stub")
        plan = build_plan(loaded.config, site, run, job_id="pending")
        write_plan(run, plan)
        script = render_job(loaded.config, run, plan, attempt=attempt, site=site)
        (run.root / "probe").mkdir()
        (run.root / "probe" / "trainer_seconds").write_text(str(trainer_seconds))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_"))}
        env.update(
            PATH=f"{stubs}:{env['PATH']}", STUB_LOG=str(tmp_path), SLURM_JOB_ID="9001", SLURM_JOB_NODELIST="node1"
        )
        return run, script, env

    return make


def _start(script: Path, env: dict, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(
        ["bash", str(script)],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def test_b07_no_host_list_launches_nothing(stub_job, tmp_path) -> None:
    _run, script, env = stub_job("", tmp_path / "out")
    del env["SLURM_JOB_NODELIST"]
    env["PATH"] = env["PATH"]  # stub scontrol absent would not matter: expansion is in Python
    proc = _start(script, env, tmp_path)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "SLURM_JOB_NODELIST is not set" in out and "nothing was launched" in out
    assert not (tmp_path / "srun.log").exists()
    code = [ln for ln in script.read_text().splitlines() if not ln.lstrip().startswith("#")]
    assert not [ln for ln in code if "localhost" in ln]


def test_shell_metacharacters_never_execute(stub_job, tmp_path) -> None:
    evil_dir = tmp_path / "o;touch${IFS}PWNED1;$(touch${IFS}PWNED2)|&<>*?{a,b}"
    toml = (
        'job_name = "j$(touch${IFS}PWNED6)"\npartition = "debug;touch${IFS}PWNED7"\n'
        'secret_env_vars = ["HF_TOKEN"]\n'
        '[run]\nname = "r.1-x"\n[env_vars]\nEVIL = "$(touch PWNED3); `touch PWNED4` \\" \' && touch PWNED5"\n'
    )
    run, script, env = stub_job(toml, evil_dir, trainer_seconds=1)
    proc = _start(script, env, tmp_path)
    out, _ = proc.communicate(timeout=90)
    assert proc.returncode == 0, out
    recs = [json.loads(p.read_text()) for p in (run.root / "probe").glob("*.json")]
    assert len(recs) == 3
    trainer = next(r for r in recs if r["role"] == "trainer")
    assert trainer["env"]["SRL_RUN_DIR"] == str(run.root)
    assert trainer["env"]["EVIL"] == "$(touch PWNED3); `touch PWNED4` \" ' && touch PWNED5"
    assert "PWNED6" in script.read_text()  # the job name reached the #SBATCH line verbatim (sbatch, not bash)
    pwned = [p for p in tmp_path.rglob("PWNED*")] + [p for p in Path.cwd().glob("PWNED*")]
    assert not pwned, f"injected commands ran: {pwned}"


def test_a_job_refuses_a_run_held_by_a_live_supervisor_and_a_requeued_job_takes_over_its_own(stub_job, tmp_path):
    run, script, env = stub_job("", tmp_path / "out", trainer_seconds=1)
    other = lease.acquire(run, command="srl rl --resume")  # a live supervisor of the same run (this process)
    proc = _start(script, env, tmp_path)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1, out
    assert f"pid {os.getpid()}" in out and "srl rl --resume" in out and "srl cancel" in out
    assert "nothing was launched" in out and not (tmp_path / "srun.log").exists()
    other.release()

    # The lease the job's previous incarnation left (still unexpired, on another node): the requeued job takes it.
    now = time.time()
    run.lease_file.write_text(
        json.dumps(
            {
                "token": "prev",
                "host": "node9",
                "pid": 1,
                "pid_start": None,
                "job_id": "9001",
                "command": "srl rl (batch job)",
                "acquired": now - 60,
                "renewed": now - 1,
                "expires": now + 44,
            }
        )
    )
    proc = _start(script, env, tmp_path)
    out, _ = proc.communicate(timeout=90)
    assert proc.returncode == 0, out
    assert "took over the run lease" in out and "the same Slurm job 9001 was requeued" in out
    trainer = next(json.loads(p.read_text()) for p in (run.root / "probe").glob("*.json") if "trainer" in p.name)
    assert trainer["env"]["SRL_RUN_LEASE"] not in ("", "prev")  # the components run under the new lease
    assert not run.lease_file.exists()  # released when the job's shell ended
