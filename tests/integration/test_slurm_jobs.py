"""Job control against the real local Slurm cluster: submit, state, cancel, hetjob, signal + requeue.

Each test submits real batch scripts to the 4-node cluster of ``.ci/setup-slurm.sh`` and checks both what the
job did (its output file) and what :mod:`toolkit.launch.slurm` reads back from slurmctld.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from toolkit.launch import slurm

pytestmark = [pytest.mark.slow, pytest.mark.slurm]
# Waits for a state change are generous (minutes): slurmctld and slurmd act late on two busy cores, and a bound
# only ends a wait that would otherwise never end.


def _wait_for_file_line(path: Path, needle: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and needle in path.read_text():
            return path.read_text()
        time.sleep(0.2)
    raise AssertionError(
        f"{needle!r} not in {path} after {timeout_s} s: {path.read_text() if path.exists() else '(missing)'}"
    )


def test_two_node_job_records_node_names_and_gpus(slurm_cluster, tmp_path):
    script = """#!/bin/bash
#SBATCH -N 2 --ntasks-per-node=1 --gres=gpu:2 -t 2
#SBATCH -o out-%j.txt
srun -l bash -c 'echo "node=$SLURMD_NODENAME cuda=$CUDA_VISIBLE_DEVICES"'
"""
    t0 = time.monotonic()
    job = slurm_cluster.submit_text(tmp_path, script)
    running = slurm.wait(job, timeout_s=120, until={"RUNNING", "COMPLETING", "COMPLETED"})
    submit_to_running_s = time.monotonic() - t0
    final = slurm_cluster.wait_job(job, timeout_s=180)

    assert final["state"] == "COMPLETED", final
    assert final["exit_code"] == 0
    assert len(final["node_list"]) == 2
    lines = sorted((tmp_path / f"out-{job}.txt").read_text().split("\n"))
    lines = [ln for ln in lines if ln]
    # srun -l prefixes each line with its task rank; one task per node.
    assert len(lines) == 2, lines
    seen = {ln.split("node=")[1].split()[0]: ln.split("cuda=")[1] for ln in lines}
    assert sorted(seen) == sorted(final["node_list"])
    # 2 of the node's 4 fake GPUs; global indices, since there is no device cgroup to renumber them.
    assert all(len(v.split(",")) == 2 for v in seen.values()), seen
    print(f"submit->{running.state}: {submit_to_running_s:.2f} s")


def test_failing_job_is_failed_with_exit_code(slurm_cluster, tmp_path):
    job = slurm_cluster.submit_text(tmp_path, "#!/bin/bash\n#SBATCH -o fail.txt\necho bye\nexit 7\n")
    st = slurm.wait(job, timeout_s=120)
    assert st.state == "FAILED"
    assert st.exit_code == 7 and st.signal == 0
    assert st.reason == "NonZeroExitCode"
    assert st.end_time is not None and st.start_time is not None and st.end_time >= st.start_time


def test_cancel_gives_cancelled(slurm_cluster, tmp_path):
    job = slurm_cluster.submit_text(tmp_path, "#!/bin/bash\n#SBATCH -o c.txt\nsleep 300\n")
    slurm.wait(job, timeout_s=120, until={"RUNNING"})
    slurm.cancel(job)
    st = slurm.wait(job, timeout_s=120)
    assert st.state == "CANCELLED"
    assert st.signal == 15  # SIGTERM, what scancel sends first


def test_submit_error_carries_sbatch_message(slurm_cluster, tmp_path):
    script = tmp_path / "too_big.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --gres=gpu:9\ntrue\n")
    with pytest.raises(slurm.SubmitError) as ei:
        slurm.submit(script, cwd=tmp_path)
    assert "Requested node configuration is not available" in str(ei.value)
    assert ei.value.returncode not in (0, None)


def test_unknown_job_raises_not_found(slurm_cluster):
    with pytest.raises(slurm.JobNotFoundError, match="scontrol"):
        slurm.job_state("987654321")


def test_hetjob_reports_both_components(slurm_cluster, tmp_path):
    # Output options must sit in the first component: the batch script runs there.
    script = """#!/bin/bash
#SBATCH -N 1 -n 1 --gres=gpu:1 -o het-%j.txt -t 2
#SBATCH hetjob
#SBATCH -N 2 -n 2
srun --het-group=0,1 bash -c 'echo "group=$SLURM_HET_SIZE node=$SLURMD_NODENAME"'
"""
    job = slurm_cluster.submit_text(tmp_path, script)
    st = slurm.wait(job, timeout_s=180)
    assert st.state == "COMPLETED", st
    assert [c.job_id for c in st.het_components] == [f"{job}+0", f"{job}+1"]
    assert [len(c.node_list) for c in st.het_components] == [1, 2]
    assert all(c.state == "COMPLETED" for c in st.het_components)
    out = (tmp_path / f"het-{job}.txt").read_text().split("\n")
    assert sum("group=2" in ln for ln in out) == 3, out
    # A component asked for by its own id comes back alone.
    comp = slurm.job_state(f"{job}+1")
    assert comp.job_id == f"{job}+1" and comp.node_list == st.het_components[1].node_list


def test_array_tasks_are_listed(slurm_cluster, tmp_path):
    job = slurm_cluster.submit_text(
        tmp_path, "#!/bin/bash\n#SBATCH -a 0-2%2 -o a-%A_%a.txt\nexit $SLURM_ARRAY_TASK_ID\n"
    )
    st = slurm.wait(job, timeout_s=180)
    assert [t.job_id for t in st.array_tasks] == [f"{job}_0", f"{job}_1", f"{job}_2"]
    assert [t.state for t in st.array_tasks] == ["COMPLETED", "FAILED", "FAILED"]
    assert [t.exit_code for t in st.array_tasks] == [0, 1, 2]
    assert st.state == "FAILED"  # the summary shows the worst final state


def test_signal_trap_requeue_keeps_first_attempt_log(slurm_cluster, tmp_path):
    # --signal=B:USR2@58 with a 1-minute limit: slurmctld checks time limits periodically, so USR2 reaches
    # the batch shell within ~30 s of start. The trap requeues the job; the second attempt sees
    # SLURM_RESTART_COUNT=1 and ends at once. --open-mode=append keeps the first attempt's lines (the default
    # truncates on restart).
    script = """#!/bin/bash
#SBATCH -t 1 --signal=B:USR2@58 --open-mode=append -o rq-%j.txt
echo "attempt restart=${SLURM_RESTART_COUNT:-0}"
if [[ ${SLURM_RESTART_COUNT:-0} -ge 1 ]]; then echo "second attempt done"; exit 0; fi
trap 'echo "got USR2"; scontrol requeue "$SLURM_JOB_ID"; exit 0' USR2
sleep 1000 &
wait
"""
    t0 = time.monotonic()
    job = slurm_cluster.submit_text(tmp_path, script)
    log = tmp_path / f"rq-{job}.txt"
    _wait_for_file_line(log, "got USR2", timeout_s=180)
    signal_s = time.monotonic() - t0
    st = slurm.wait(job, timeout_s=180, until={"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"})
    total_s = time.monotonic() - t0
    assert st.state == "COMPLETED", st
    assert st.restart_count == 1
    text = log.read_text()
    assert "attempt restart=0" in text and "got USR2" in text, text
    assert "attempt restart=1" in text and "second attempt done" in text, text
    assert text.index("attempt restart=0") < text.index("attempt restart=1")
    print(f"USR2 after {signal_s:.1f} s, requeued attempt done after {total_s:.1f} s")


def test_requeue_from_outside_counts_restart(slurm_cluster, tmp_path):
    job = slurm_cluster.submit_text(
        tmp_path,
        "#!/bin/bash\n#SBATCH -o r.txt --open-mode=append\necho run $SLURM_RESTART_COUNT\nsleep 300\n",
    )
    slurm.wait(job, timeout_s=120, until={"RUNNING"})
    slurm.requeue(job)
    st = slurm.wait(job, timeout_s=180, until={"RUNNING"})
    # The job can only be RUNNING again after its requeue has been counted.
    assert st.restart_count == 1
    slurm.cancel(job)
    assert slurm.wait(job, timeout_s=120).state == "CANCELLED"


def test_cluster_nodes(slurm_cluster):
    nodes = slurm_cluster.nodes()
    assert [n["name"] for n in nodes] == ["node1", "node2", "node3", "node4"]
    assert all(n["cpus"] == 2 and n["memory_mb"] == 4000 and n["gres"].startswith("gpu:4") for n in nodes)
