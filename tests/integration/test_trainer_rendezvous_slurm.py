"""A multi-node trainer whose torchrun rendezvous cannot complete, on the real local Slurm cluster: the job fails
within ``deployment.trainer_rendezvous_timeout_s`` (15 s here) with a message naming the trainer node that never
joined, instead of waiting to its time limit (4 h).

The 3-node job of test_rl_sbatch_slurm.py (engines, router and orchestrator as probes on node 0; a 2-node trainer)
with the real torchrun, whose agents really rendezvous over c10d. The fault is injected where no real part fails on
demand: on trainer node 1 the step's interpreter hangs before it reaches torchrun (as a node whose container or
filesystem hangs would); every other process runs the real interpreter.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_rl_sbatch_slurm import WAIT_S, _batch_log, _config, _probe_bin, _wait_log

from toolkit.config import load_config
from toolkit.launch import slurm
from toolkit.launch.control import status_main
from toolkit.launch.prepare import prepare_run
from toolkit.launch.submit import submit_job
from toolkit.placement import read_plan
from toolkit.placement.runtime import torchrun_starting_line

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 15


def _site(tmp: Path, bindir: Path, python: Path) -> Path:
    sites = tmp / "sites"
    sites.mkdir()
    (sites / "rdzv-slurm.toml").write_text(
        (REPO / "site-configs" / "local-slurm.toml")
        .read_text()
        .replace('name = "local-slurm"', 'name = "rdzv-slurm"')
        .replace('python = "python3"', f'python = "{python}"\nsetup = ["export PATH={bindir}:$PATH"]')
    )
    return sites


def _hanging_python(tmp: Path, bindir: Path) -> Path:
    """The job's interpreter: the real one for srl's own modules (the supervisor, each step's runtime), the probe
    for the rest (the engines); the trainer step's second node (srun task 1) hangs before it execs torchrun."""
    d = tmp / "python-bin"
    d.mkdir()
    p = d / "python"
    p.write_text(f"""#!/bin/sh
case " $* " in
  *" toolkit.placement.runtime exec "*" --process trainer "*) [ "$SLURM_PROCID" = 1 ] && exec sleep 600 ;;
esac
case "$2" in
  toolkit.*) exec {sys.executable} "$@" ;;
esac
exec {bindir / "python"} "$@"
""")
    p.chmod(0o755)
    return p


def test_a_trainer_node_that_never_joins_fails_the_job_within_the_timeout_naming_it(tmp_path, monkeypatch, capsys):
    bindir = _probe_bin(tmp_path)
    torchrun = bindir / "torchrun"  # the real torchrun of this interpreter instead of the probe
    torchrun.write_text(f'#!/bin/sh\nexec {sys.executable} -m torch.distributed.run "$@"\n')
    monkeypatch.setenv("SRL_SITE_CONFIGS", str(_site(tmp_path, bindir, _hanging_python(tmp_path, bindir))))
    path = _config(tmp_path, "rdzv")
    text = path.read_text().replace('site = "probe-slurm"', 'site = "rdzv-slurm"')
    text = text.replace("[deployment]\n", f"[deployment]\ntrainer_rendezvous_timeout_s = {TIMEOUT_S}\n")
    path.write_text(text.replace("checkpoint_grace_s = 10", "checkpoint_grace_s = 3"))
    loaded = load_config([path])
    run, attempt = prepare_run(loaded, argv=["srl", "rl"])
    (run.root / "probe").mkdir()

    logs = run.log_attempt(attempt)
    job = submit_job(loaded.config, run, attempt)
    # Timed from trainer node 0's record that it starts torchrun (scheduling, the supervisor and the other steps'
    # start come before it) to the supervisor's record that the trainer step ended.
    starting = re.escape(torchrun_starting_line(0, 2, "@HOST@")).replace("@HOST@", r"[^)]*")
    _wait_log(run, starting, WAIT_S, path=logs / "trainer-0.log")
    t0 = time.monotonic()  # no earlier than the line was written
    _wait_log(run, re.escape("teardown: trainer exited first (status"), WAIT_S)
    took = time.monotonic() - t0
    st = slurm.wait(job, timeout_s=WAIT_S)
    log = _batch_log(run)
    assert (st.state, st.exit_code) == ("FAILED", 1), (st, log)  # exit status 1: a role failed
    # torchrun's agent waits TIMEOUT_S from its own start, after its imports (slow on a busy machine); the default
    # join timeout (300 s) could not have ended it within this bound, so the configured one did.
    assert took < 150, (took, log)

    plan = read_plan(run)
    trainer = plan.process("trainer")
    missing = plan.hosts[trainer.node_indices[1]]
    # The node that did start torchrun gave up on its own, by torchrun's timeout (not killed by srl or Slurm).
    assert "RendezvousTimeoutError" in (logs / "trainer-0.log").read_text()
    assert "starting torchrun" not in (logs / "trainer-1.log").read_text()

    end = json.loads(run.ending.read_text())
    assert (end["cause"], end["role"]) == ("failed", "trainer"), end
    expected = (
        f"the torchrun rendezvous of the 2 trainer nodes did not complete within {TIMEOUT_S} s "
        f"(deployment.trainer_rendezvous_timeout_s): {missing} (trainer node 1 of 2; log "
        f"{logs / 'trainer-1.log'}) did not join (its torchrun never started)"
    )
    assert end["reason"] == expected, end
    assert f"trainer failed: {expected}" in log  # the supervisor's log
    assert f"srl: run ended: failed in trainer: {expected} (exit status 1)" in log
    capsys.readouterr()
    status_main([str(run.root)])
    assert expected in capsys.readouterr().out  # srl status
