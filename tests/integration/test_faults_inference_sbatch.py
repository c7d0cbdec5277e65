"""Injection safety of the rendered inference-only batch script (issue 9 item 5), executed with bash.

Like ``test_rl_sbatch_stubs.py`` for ``rl.sbatch``: a stub ``srun`` runs each step here, every component is the
probe (``probe/probe.py``), and the config carries shell metacharacters in the output directory, job name and
env values. The engines must receive the values verbatim and no injected command may run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_rl_sbatch_stubs import _bin, stub_site

from toolkit import lease
from toolkit.config import load_config
from toolkit.launch.prepare import prepare_run
from toolkit.placement import build_plan, write_plan
from toolkit.placement.plan import INFERENCE_ROLES
from toolkit.preflight.site import load_site
from toolkit.render import render_job

pytestmark = pytest.mark.slow
EVIL_VALUE = "$(touch PWNED3); `touch PWNED4` \" ' && touch PWNED5"


def test_inference_script_never_executes_injected_values(tmp_path, monkeypatch):
    stubs, probes = _bin(tmp_path)
    stub_site(tmp_path, probes, monkeypatch)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")  # HF-format dir for config validation; never loaded
    evil_dir = tmp_path / "o;touch${IFS}PWNED1;$(touch${IFS}PWNED2)|&<>*?{a,b}"
    cfg = tmp_path / "serve.toml"
    cfg.write_text(
        f'output_dir = {json.dumps(str(evil_dir))}\nsite = "stub"\n[model]\nname = "{model}"\n'
        f'[run]\nname = "srv.1"\n[slurm]\njob_name = "j$(touch${{IFS}}PWNED6)"\n'
        f'secret_env_vars = ["HF_TOKEN"]\n[inference.env_vars]\nEVIL = {json.dumps(EVIL_VALUE)}\n'
    )
    loaded = load_config([cfg], purpose="serve")  # what `srl inference` validates
    run, attempt = prepare_run(loaded, argv=["srl", "inference"])
    # Submission hands the run's lease over to the job (launch/submit.py); here the test runs the job itself.
    lease.held(run).release()
    site = load_site("stub")
    plan = build_plan(loaded.config, site, run, job_id="pending", roles=INFERENCE_ROLES)
    write_plan(run, plan)
    script = render_job(loaded.config, run, plan, "inference", attempt=attempt, site=site)
    (run.root / "probe").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_"))}
    env.update(PATH=f"{stubs}:{env['PATH']}", STUB_LOG=str(tmp_path), SLURM_JOB_ID="9002", SLURM_JOB_NODELIST="node1")
    proc = subprocess.Popen(
        ["bash", str(script)],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    engines = [p for p in plan.processes if p.role == "inference"]
    deadline = time.monotonic() + 90
    try:
        while len([p for p in (run.root / "probe").glob("*.json") if "inference" in p.name]) < len(engines):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate(timeout=10)[0]
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=90)
    recs = [json.loads(p.read_text()) for p in (run.root / "probe").glob("*.json")]
    eng = [r for r in recs if r["role"] == "inference"]
    assert eng and all(r["env"]["EVIL"] == EVIL_VALUE for r in eng), out
    assert all(r["env"]["SRL_RUN_DIR"] == str(run.root) for r in eng)
    pwned = list(tmp_path.rglob("PWNED*")) + list(Path.cwd().glob("PWNED*"))
    assert not pwned, f"injected commands ran: {pwned}\n{out}"
    print(
        f"\n[figure] inference.sbatch: 3 injected values (output dir, job name, env value) "
        f"reached {len(eng)} engine(s) verbatim, 0 executed"
    )
