"""Queue-aware placement on the real local Slurm cluster (4 nodes): with a blocker job holding two nodes, a run of
3 nodes (2 inference replicas and a trainer node) cannot start before the blocker ends, one of 2 nodes (1 replica)
can start now. The dry run prints Slurm's own estimate for both shapes; ``--start-soonest`` submits the 2-node one
(components are probes, tests/integration/probe/probe.py: the job is real, the roles are not the subject here)."""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path

import pytest
from slurm_cluster import submit_sleeper
from test_rl_sbatch_slurm import _batch_log, _probe_bin, _site_dir

from toolkit.cli import main
from toolkit.launch import slurm
from toolkit.launch.submit import read_job_ids
from toolkit.run.layout import RunDir

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

BLOCKER_MINUTES = 30


def _config(tmp: Path) -> Path:
    model = tmp / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")  # a HF-format directory as far as validation looks; probes never load it
    path = tmp / "queue.toml"
    path.write_text(f"""
output_dir = "{tmp / "out"}"
site = "probe-slurm"
max_steps = 2
[run]
name = "queue"
[model]
name = "{model}"
[[orchestrator.train.env]]
taskset = {{ id = "srl-reverse-text" }}
[deployment]
type = "multi_node"
gpus_per_node = 0
num_train_nodes = 1
num_infer_replicas = 2
orchestrator = "with_inference"
[slurm]
time = "00:10:00"
signal_lead_s = 60
checkpoint_grace_s = 10
""")
    return path


@pytest.fixture
def blocker():
    """A job holding two of the four nodes for BLOCKER_MINUTES (its time limit is what Slurm's estimate uses)."""
    job = submit_sleeper("-N", "2", "--exclusive", f"--time={BLOCKER_MINUTES}", job_name="srl-blocker")
    try:
        slurm.wait(job, timeout_s=120, until={"RUNNING"})
        yield job
    finally:
        slurm.cancel(job)


def _estimates(text: str) -> dict[int, str]:
    """replicas -> the estimate line for that shape."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"start estimate: (\d+) node\(s\), (\d+) inference replica", line)
        if m:
            out[int(m.group(2))] = line
    return out


def _start(line: str) -> datetime:
    m = re.search(r"\((\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\)", line)
    assert m, line
    return datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")


def test_dry_run_prints_slurms_estimates_and_start_soonest_submits_the_earlier_shape(
    tmp_path, monkeypatch, capsys, blocker
):
    monkeypatch.setenv("SRL_SITE_CONFIGS", str(_site_dir(tmp_path, _probe_bin(tmp_path))))
    cfg = _config(tmp_path)
    assert main(["rl", "@", str(cfg), "--dry-run"]) == 0
    shown = _estimates(capsys.readouterr().out)
    assert set(shown) == {2, 1}, shown
    assert "3 node(s), 2 inference replica(s), the config's shape" in shown[2]
    assert "2 node(s), 1 inference replica(s)" in shown[1] and "starts now" in shown[1], shown[1]
    # The 3-node shape waits for the blocker's time limit (Slurm's own figure, not ours).
    wait_min = (_start(shown[2]) - _start(shown[1])).total_seconds() / 60
    assert BLOCKER_MINUTES - 5 <= wait_min <= BLOCKER_MINUTES + 5, shown

    assert main(["rl", "@", str(cfg), "--start-soonest"]) == 0
    said = capsys.readouterr().out
    assert "start-soonest: submitting 2 node(s), 1 inference replica(s) instead of 3 node(s)" in said, said
    run = RunDir(tmp_path / "out" / "queue")
    job = read_job_ids(run)[-1][0]
    st = slurm.wait(job, timeout_s=300)
    assert st.state == "COMPLETED", _batch_log(run)
    resolved = json.loads((run.latest_configs / "resolved" / "rl.json").read_text())
    assert resolved["deployment"]["num_infer_replicas"] == 1
    ran = json.loads(run.placement_file.read_text())
    assert ran["job_id"] == job and len(ran["hosts"]) == 2, ran["hosts"]
