"""The batch job's supervisor (toolkit/launch/supervisor.py) on the real local Slurm cluster, every component a
probe (probe/probe.py): the pre-run command runs from its file on every node and never on a command line. (The
pre-timeout signal, teardown and engine restarts: test_rl_sbatch_slurm.py and test_engine_restart_slurm.py.)
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import test_rl_sbatch_slurm
from test_rl_sbatch_slurm import _batch_log

from toolkit.launch import slurm
from toolkit.launch.submit import submit_job

probe_run = test_rl_sbatch_slurm.probe_run  # the fixture, shared

pytestmark = [pytest.mark.slow, pytest.mark.slurm]


def test_pre_run_command_runs_from_its_file_and_never_on_a_command_line(probe_run):
    token = f"srl-prerun-{uuid.uuid4().hex}"
    # pkill -f with a unique token kills every process whose command line holds it: srun, the supervisor or bash
    # would die if the command's text were passed on a command line.
    cfg, run, attempt = probe_run(
        "prerun", trainer_seconds=2, extra=f'pre_run_command = "pkill -9 -f {token} || true; echo pre-run-done-{token}"'
    )
    job = submit_job(cfg, run, attempt)
    st = slurm.wait(job, timeout_s=120)
    log = _batch_log(run)
    assert st.state == "COMPLETED", (st, log)
    assert log.count(f"pre-run-done-{token}") == 3, log  # once per node of the allocation
    assert token not in (run.launcher / "rl.sbatch").read_text()
