"""Parsing of real Slurm output into JobState, and environment scrubbing. Fast; no cluster needed.

The records at the bottom of this file were printed by the local test cluster (``.ci/setup-slurm.sh``) for
jobs in each state; the tests check that :mod:`toolkit.launch.slurm` reads them as Slurm meant.
"""

from __future__ import annotations

from datetime import datetime

import pytest

from toolkit.launch import slurm


def _state(records: list[str], job_id: str) -> slurm.JobState:
    return slurm.summarize(job_id, [slurm.job_state_from_record(slurm.parse_scontrol_record(r)) for r in records])


def _squeue_state(lines: list[str], job_id: str) -> slurm.JobState:
    return slurm.summarize(job_id, [slurm.parse_squeue_line(ln) for ln in lines])


# ---- scrubbed_env ------------------------------------------------------------------------------------------


def test_scrubbed_env_drops_inherited_slurm_options_and_keeps_conf():
    base = {
        "PATH": "/usr/bin",
        "HOME": "/root",
        "SLURM_JOB_ID": "41",
        "SLURM_NTASKS": "8",
        "SLURM_CONF": "/etc/slurm/slurm.conf",
        "SBATCH_PARTITION": "gpu",
        "SRUN_CPUS_PER_TASK": "4",
        "SALLOC_ACCOUNT": "x",
        "MY_SLURM_NOTE": "kept: the prefix must lead",
    }
    env = slurm.scrubbed_env(base)
    assert env == {
        "PATH": "/usr/bin",
        "HOME": "/root",
        "SLURM_CONF": "/etc/slurm/slurm.conf",
        "MY_SLURM_NOTE": "kept: the prefix must lead",
    }
    assert base["SLURM_JOB_ID"] == "41"  # the input is not modified


def test_scrubbed_env_defaults_to_process_environment(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[1-2]")
    monkeypatch.setenv("SRL_SOMETHING", "1")
    env = slurm.scrubbed_env()
    assert "SLURM_JOB_NODELIST" not in env and env["SRL_SOMETHING"] == "1"


# ---- expand_nodelist ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("node[1-2]", ["node1", "node2"]),
        ("node[1-3,7],gpu-a[01-02]", ["gpu-a01", "gpu-a02", "node1", "node2", "node3", "node7"]),
        ("node4", ["node4"]),
        ("", []),
        ("(null)", []),
    ],
)
def test_expand_nodelist(text, hosts):
    assert sorted(slurm.expand_nodelist(text)) == hosts


# ---- scontrol show job -o records --------------------------------------------------------------------------


def test_parse_record_keeps_values_with_equals_and_slash_keys():
    rec = slurm.parse_scontrol_record(COMPLETED_2NODE[0])
    assert rec["TRES"] == "cpu=2,node=2,billing=2"
    assert rec["AllocNode:Sid"] == "localhost:2400"
    assert rec["CPUs/Task"] == "1"
    assert rec["Power"] == ""
    assert rec["TresPerNode"] == "gres:gpu:2"


def test_completed_two_node_job():
    st = _state(COMPLETED_2NODE, "1")
    assert (st.job_id, st.state, st.reason, st.exit_code, st.signal) == ("1", "COMPLETED", None, 0, 0)
    assert st.node_list == ("node1", "node2")
    assert st.start_time == datetime(2026, 11, 29, 11, 46, 17)
    assert st.end_time == datetime(2026, 11, 29, 11, 46, 21)
    assert st.is_terminal and st.restart_count == 0
    assert st.het_components == () and st.array_tasks == ()


def test_failed_job_exit_code():
    st = _state(FAILED, "2")
    assert (st.state, st.reason, st.exit_code, st.signal) == ("FAILED", "NonZeroExitCode", 3, 0)


def test_cancelled_job_signal():
    st = _state(CANCELLED, "3")
    assert (st.state, st.exit_code, st.signal) == ("CANCELLED", 0, 15)


def test_running_job_has_no_exit_code_or_end_time():
    st = _state(RUNNING, "14")
    assert st.state == "RUNNING" and not st.is_terminal
    # Slurm prints the time-limit end and ExitCode=0:0 while running; neither is a result yet.
    assert st.exit_code is None and st.signal is None and st.end_time is None
    assert st.start_time is not None and st.node_list == ("node1",)


def test_pending_job_has_no_nodes_or_start():
    st = _state(PENDING_RESOURCES, "15")
    assert (st.state, st.reason) == ("PENDING", "Resources")
    assert st.node_list == () and st.start_time is None and st.end_time is None


def test_requeue_sequence_counts_restart():
    completing = _state(REQUEUE_COMPLETING, "14")
    pending = _state(REQUEUE_PENDING, "20")
    running = _state(REQUEUE_RUNNING, "20")
    assert (completing.state, completing.restart_count) == ("COMPLETING", 1)
    assert not completing.is_terminal
    assert (pending.state, pending.reason, pending.restart_count) == ("PENDING", "BeginTime", 1)
    assert (running.state, running.restart_count) == ("RUNNING", 1)


def test_timeout_job():
    st = _state(TIMEOUT, "12")
    assert (st.state, st.reason, st.exit_code, st.signal) == ("TIMEOUT", "TimeLimit", 0, 15)
    assert st.is_terminal


def test_node_fail_job():
    st = _state(NODE_FAIL, "13")
    assert (st.state, st.reason) == ("NODE_FAIL", "NodeDown")
    assert st.node_list == ("node4",) and st.is_terminal


def test_hetjob_components():
    st = _state(HETJOB_COMPLETED, "5")
    assert st.state == "COMPLETED" and st.job_id == "5"
    assert [c.job_id for c in st.het_components] == ["5+0", "5+1"]
    assert [c.node_list for c in st.het_components] == [("node1",), ("node2", "node3")]
    assert st.node_list == ("node1",)  # top-level fields are component 0's


def test_hetjob_component_alone():
    st = _state(HETJOB_COMPLETED[1:], "5+1")
    assert st.job_id == "5+1" and st.het_components == () and st.node_list == ("node2", "node3")


def test_array_with_running_and_pending_block():
    st = _state(ARRAY_MIXED, "16")
    assert [t.job_id for t in st.array_tasks] == ["16_0", "16_1", "16_[2-3%2]"]
    assert [t.state for t in st.array_tasks] == ["RUNNING", "RUNNING", "PENDING"]
    assert st.array_tasks[2].reason == "JobArrayTaskLimit"
    assert st.state == "RUNNING" and not st.is_terminal
    assert set(st.node_list) == {"node2", "node3"}


def test_array_done():
    st = _state(ARRAY_DONE, "7")
    assert [t.job_id for t in st.array_tasks] == ["7_0", "7_1", "7_2", "7_3"]
    assert st.state == "COMPLETED" and st.exit_code == 0
    assert st.start_time == datetime(2026, 11, 29, 11, 46, 17)
    assert st.end_time == datetime(2026, 11, 29, 11, 46, 24)


def test_summarize_rejects_empty():
    with pytest.raises(ValueError):
        slurm.summarize("1", [])


# ---- squeue -t all fallback --------------------------------------------------------------------------------


def test_squeue_failed_decodes_wait_status():
    st = _squeue_state(SQ_FAILED, "2")
    # squeue prints the raw wait status: 768 == exit 3 << 8.
    assert (st.state, st.reason, st.exit_code, st.signal) == ("FAILED", "NonZeroExitCode", 3, 0)
    assert st.end_time == datetime(2026, 11, 29, 11, 46, 18)


def test_squeue_cancelled_and_timeout_signal():
    assert (_squeue_state(SQ_CANCELLED, "3").signal, _squeue_state(SQ_TIMEOUT, "12").signal) == (15, 15)
    assert _squeue_state(SQ_TIMEOUT, "12").state == "TIMEOUT"
    assert _squeue_state(SQ_NODE_FAIL, "13").state == "NODE_FAIL"


def test_squeue_hetjob_and_array_match_scontrol():
    het = _squeue_state(SQ_HETJOB, "5")
    assert [c.job_id for c in het.het_components] == ["5+0", "5+1"]
    assert het.het_components[1].node_list == ("node2", "node3")
    arr = _squeue_state(SQ_ARRAY, "7")
    assert [t.job_id for t in arr.array_tasks] == ["7_0", "7_1", "7_2", "7_3"]
    assert arr.state == _state(ARRAY_DONE, "7").state


# ---- errors ------------------------------------------------------------------------------------------------


def test_command_error_names_command_and_stderr():
    err = slurm.SubmitError(
        ["sbatch", "--parsable", "x.sbatch"],
        1,
        "sbatch: error: Batch job submission failed: Requested node configuration is not available\n",
    )
    assert "`sbatch --parsable x.sbatch` failed (exit code 1)" in str(err)
    assert err.stderr.endswith("not available")


def test_missing_binary_is_a_command_error(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(slurm.SlurmCommandError, match="sbatch not found"):
        slurm.submit("/dev/null")


# ---- recorded output (literals) ----------------------------------------------------------------------------
# Real `scontrol show job -o` output of the local test cluster (slurm-wlm 22.05.8), one entry per record.
COMPLETED_2NODE = [
    (
        "JobId=1 JobName=wrap UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901759 Nice=0 "
        "Account=(null) QOS=(null) JobState=COMPLETED Reason=None Dependency=(null) Requeue=1 Restarts=0 "
        "BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:04 TimeLimit=365-00:00:00 TimeMin=N/A "
        "SubmitTime=2026-11-29T11:46:17 EligibleTime=2026-11-29T11:46:17 AccrueTime=2026-11-29T11:46:17 "
        "StartTime=2026-11-29T11:46:17 EndTime=2026-11-29T11:46:21 Deadline=N/A SuspendTime=None "
        "SecsPreSuspend=0 LastSchedEval=2026-11-29T11:46:17 Scheduler=Backfill Partition=debug "
        "AllocNode:Sid=localhost:2400 ReqNodeList=(null) ExcNodeList=(null) NodeList=node[1-2] "
        "BatchHost=node1 NumNodes=2 NumCPUs=2 NumTasks=2 CPUs/Task=1 ReqB:S:C:T=0:0:*:* "
        "TRES=cpu=2,node=2,billing=2 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 "
        "MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 "
        "Licenses=(null) Network=(null) Command=(null) WorkDir=/tmp/slurmrec StdErr=/tmp/slurmrec/ok-1.out "
        "StdIn=/dev/null StdOut=/tmp/slurmrec/ok-1.out Power= TresPerNode=gres:gpu:2 "
    ),
]
FAILED = [
    (
        "JobId=2 JobName=wrap UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901758 Nice=0 "
        "Account=(null) QOS=(null) JobState=FAILED Reason=NonZeroExitCode Dependency=(null) Requeue=1 "
        "Restarts=0 BatchFlag=1 Reboot=0 ExitCode=3:0 RunTime=00:00:01 TimeLimit=365-00:00:00 TimeMin=N/A "
        "SubmitTime=2026-11-29T11:46:17 EligibleTime=2026-11-29T11:46:17 AccrueTime=2026-11-29T11:46:17 "
        "StartTime=2026-11-29T11:46:17 EndTime=2026-11-29T11:46:18 Deadline=N/A SuspendTime=None "
        "SecsPreSuspend=0 LastSchedEval=2026-11-29T11:46:17 Scheduler=Backfill Partition=debug "
        "AllocNode:Sid=localhost:2400 ReqNodeList=(null) ExcNodeList=(null) NodeList=node1 BatchHost=node1 "
        "NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=1,node=1,billing=1 "
        "Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 "
        "Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) "
        "Command=(null) WorkDir=/tmp/slurmrec StdErr=/tmp/slurmrec/fail-2.out StdIn=/dev/null "
        "StdOut=/tmp/slurmrec/fail-2.out Power= "
    ),
]
CANCELLED = [
    (
        "JobId=3 JobName=wrap UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901757 Nice=0 "
        "Account=(null) QOS=(null) JobState=CANCELLED Reason=None Dependency=(null) Requeue=1 Restarts=0 "
        "BatchFlag=1 Reboot=0 ExitCode=0:15 RunTime=00:00:01 TimeLimit=365-00:00:00 TimeMin=N/A "
        "SubmitTime=2026-11-29T11:46:17 EligibleTime=2026-11-29T11:46:17 AccrueTime=2026-11-29T11:46:17 "
        "StartTime=2026-11-29T11:46:17 EndTime=2026-11-29T11:46:18 Deadline=N/A SuspendTime=None "
        "SecsPreSuspend=0 LastSchedEval=2026-11-29T11:46:17 Scheduler=Backfill Partition=debug "
        "AllocNode:Sid=localhost:2400 ReqNodeList=(null) ExcNodeList=(null) NodeList=node2 BatchHost=node2 "
        "NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=1,node=1,billing=1 "
        "Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 "
        "Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) "
        "Command=(null) WorkDir=/tmp/slurmrec StdErr=/tmp/slurmrec/canc-3.out StdIn=/dev/null "
        "StdOut=/tmp/slurmrec/canc-3.out Power= "
    ),
]
RUNNING = [
    (
        "JobId=14 JobName=wrap UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901749 Nice=0 "
        "Account=(null) QOS=(null) JobState=RUNNING Reason=None Dependency=(null) Requeue=1 Restarts=0 "
        "BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:01 TimeLimit=365-00:00:00 TimeMin=N/A "
        "SubmitTime=2026-11-29T11:48:54 EligibleTime=2026-11-29T11:48:54 AccrueTime=2026-11-29T11:48:54 "
        "StartTime=2026-11-29T11:48:55 EndTime=2027-11-29T11:48:55 Deadline=N/A SuspendTime=None "
        "SecsPreSuspend=0 LastSchedEval=2026-11-29T11:48:55 Scheduler=Backfill Partition=debug "
        "AllocNode:Sid=localhost:2400 ReqNodeList=(null) ExcNodeList=(null) NodeList=node1 BatchHost=node1 "
        "NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=1,node=1,billing=1 "
        "Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 "
        "Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) "
        "Command=(null) WorkDir=/tmp/slurmrec StdErr=/tmp/slurmrec/rq-14.out StdIn=/dev/null "
        "StdOut=/tmp/slurmrec/rq-14.out Power= "
    ),
]
PENDING_RESOURCES = [
    (
        "JobId=15 JobName=wrap UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901748 Nice=0 "
        "Account=(null) QOS=(null) JobState=PENDING Reason=Resources Dependency=(null) Requeue=1 Restarts=0 "
        "BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:00 TimeLimit=UNLIMITED TimeMin=N/A "
        "SubmitTime=2026-11-29T11:48:58 EligibleTime=2026-11-29T11:48:58 AccrueTime=2026-11-29T11:48:58 "
        "StartTime=2026-11-29T11:49:00 EndTime=Unknown Deadline=N/A SuspendTime=None SecsPreSuspend=0 "
        "LastSchedEval=2026-11-29T11:48:59 Scheduler=Backfill:* Partition=debug AllocNode:Sid=localhost:2400 "
        "ReqNodeList=(null) ExcNodeList=(null) NodeList= SchedNodeList=node[1-4] NumNodes=4-4 NumCPUs=4 "
        "NumTasks=4 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=4,mem=16000M,node=4,billing=4 Socks/Node=* "
        "NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) "
        "DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null) "
        "WorkDir=/tmp/slurmrec StdErr=/tmp/slurmrec/p-15.out StdIn=/dev/null StdOut=/tmp/slurmrec/p-15.out "
        "Power= TresPerNode=gres:gpu:4 "
    ),
]
REQUEUE_COMPLETING = [
    (
        "JobId=14 JobName=wrap UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901749 Nice=0 "
        "Account=(null) QOS=(null) JobState=COMPLETING Reason=None Dependency=(null) Requeue=1 Restarts=1 "
        "BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:00 TimeLimit=UNLIMITED TimeMin=N/A "
        "SubmitTime=2026-11-29T11:48:54 EligibleTime=2026-11-29T11:48:54 AccrueTime=2026-11-29T11:48:54 "
        "StartTime=2026-11-29T11:48:56 EndTime=Unknown Deadline=N/A SuspendTime=None SecsPreSuspend=0 "
        "LastSchedEval=2026-11-29T11:48:55 Scheduler=Backfill:* Partition=debug AllocNode:Sid=localhost:2400 "
        "ReqNodeList=(null) ExcNodeList=(null) NodeList=node1 BatchHost=node1 NumNodes=1 NumCPUs=1 "
        "NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=1,node=1,billing=1 Socks/Node=* "
        "NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) "
        "DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null) "
        "WorkDir=/tmp/slurmrec StdErr=/tmp/slurmrec/rq-14.out StdIn=/dev/null StdOut=/tmp/slurmrec/rq-14.out "
        "Power= "
    ),
]
REQUEUE_PENDING = [
    (
        "JobId=20 JobName=wrap UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901745 Nice=0 "
        "Account=(null) QOS=(null) JobState=PENDING Reason=BeginTime Dependency=(null) Requeue=1 Restarts=1 "
        "BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:00 TimeLimit=UNLIMITED TimeMin=N/A "
        "SubmitTime=2026-11-29T11:49:09 EligibleTime=2026-11-29T11:49:20 AccrueTime=2026-11-29T11:49:20 "
        "StartTime=Unknown EndTime=Unknown Deadline=N/A SuspendTime=None SecsPreSuspend=0 "
        "LastSchedEval=2026-11-29T11:49:05 Scheduler=Main Partition=debug AllocNode:Sid=localhost:2400 "
        "ReqNodeList=(null) ExcNodeList=(null) NodeList= NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 "
        "ReqB:S:C:T=0:0:*:* TRES=cpu=1,mem=4000M,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* "
        "CoreSpec=* MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 "
        "OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null) WorkDir=/tmp/slurmrec "
        "StdErr=/tmp/slurmrec/rq-20.out StdIn=/dev/null StdOut=/tmp/slurmrec/rq-20.out Power= "
    ),
]
REQUEUE_RUNNING = [
    (
        "JobId=20 JobName=wrap UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901745 Nice=0 "
        "Account=(null) QOS=(null) JobState=RUNNING Reason=None Dependency=(null) Requeue=1 Restarts=1 "
        "BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:00 TimeLimit=UNLIMITED TimeMin=N/A "
        "SubmitTime=2026-11-29T11:49:09 EligibleTime=2026-11-29T11:49:20 AccrueTime=2026-11-29T11:49:20 "
        "StartTime=2026-11-29T11:49:21 EndTime=Unknown Deadline=N/A SuspendTime=None SecsPreSuspend=0 "
        "LastSchedEval=2026-11-29T11:49:21 Scheduler=Main Partition=debug AllocNode:Sid=localhost:2400 "
        "ReqNodeList=(null) ExcNodeList=(null) NodeList=node1 BatchHost=node1 NumNodes=1 NumCPUs=1 "
        "NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=1,node=1,billing=1 Socks/Node=* "
        "NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) "
        "DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null) "
        "WorkDir=/tmp/slurmrec StdErr=/tmp/slurmrec/rq-20.out StdIn=/dev/null StdOut=/tmp/slurmrec/rq-20.out "
        "Power= "
    ),
]
TIMEOUT = [
    (
        "JobId=12 JobName=wrap UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901751 Nice=0 "
        "Account=(null) QOS=(null) JobState=TIMEOUT Reason=TimeLimit Dependency=(null) Requeue=1 Restarts=0 "
        "BatchFlag=1 Reboot=0 ExitCode=0:15 RunTime=00:01:20 TimeLimit=00:01:00 TimeMin=N/A "
        "SubmitTime=2026-11-29T11:48:46 EligibleTime=2026-11-29T11:48:46 AccrueTime=2026-11-29T11:48:46 "
        "StartTime=2026-11-29T11:48:46 EndTime=2026-11-29T11:50:06 Deadline=N/A SuspendTime=None "
        "SecsPreSuspend=0 LastSchedEval=2026-11-29T11:48:46 Scheduler=Main Partition=debug "
        "AllocNode:Sid=localhost:2400 ReqNodeList=(null) ExcNodeList=(null) NodeList=node1 BatchHost=node1 "
        "NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=1,node=1,billing=1 "
        "Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 "
        "Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) "
        "Command=(null) WorkDir=/tmp/slurmrec StdErr=/tmp/slurmrec/to-12.out StdIn=/dev/null "
        "StdOut=/tmp/slurmrec/to-12.out Power= "
    ),
]
NODE_FAIL = [
    (
        "JobId=13 JobName=wrap UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901750 Nice=0 "
        "Account=(null) QOS=(null) JobState=NODE_FAIL Reason=NodeDown Dependency=(null) Requeue=0 Restarts=0 "
        "BatchFlag=1 Reboot=0 ExitCode=0:15 RunTime=00:00:01 TimeLimit=UNLIMITED TimeMin=N/A "
        "SubmitTime=2026-11-29T11:48:46 EligibleTime=2026-11-29T11:48:46 AccrueTime=2026-11-29T11:48:46 "
        "StartTime=2026-11-29T11:48:46 EndTime=2026-11-29T11:48:47 Deadline=N/A SuspendTime=None "
        "SecsPreSuspend=0 LastSchedEval=2026-11-29T11:48:46 Scheduler=Main Partition=debug "
        "AllocNode:Sid=localhost:2400 ReqNodeList=node4 ExcNodeList=(null) NodeList=node4 BatchHost=node4 "
        "NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=1,node=1,billing=1 "
        "Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 "
        "Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) "
        "Command=(null) WorkDir=/tmp/slurmrec StdErr=/tmp/slurmrec/nf-13.out StdIn=/dev/null "
        "StdOut=/tmp/slurmrec/nf-13.out Power= "
    ),
]
HETJOB_COMPLETED = [
    (
        "JobId=5 HetJobId=5 HetJobOffset=0 JobName=het.sh HetJobIdSet=5-6 UserId=root(0) GroupId=root(0) "
        "MCS_label=N/A Priority=4294901755 Nice=0 Account=(null) QOS=(null) JobState=COMPLETED Reason=None "
        "Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:04 "
        "TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=2026-11-29T11:46:17 EligibleTime=2026-11-29T11:46:17 "
        "AccrueTime=2026-11-29T11:46:17 StartTime=2026-11-29T11:46:23 EndTime=2026-11-29T11:46:27 "
        "Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-11-29T11:46:23 Scheduler=Backfill "
        "Partition=debug AllocNode:Sid=localhost:2400 ReqNodeList=(null) ExcNodeList=(null) NodeList=node1 "
        "BatchHost=node1 NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* "
        "TRES=cpu=1,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 "
        "MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 "
        "Licenses=(null) Network=(null) Command=/tmp/slurmrec/het.sh WorkDir=/tmp/slurmrec "
        "StdErr=/tmp/slurmrec/slurm-5.out StdIn=/dev/null StdOut=/tmp/slurmrec/slurm-5.out Power= "
        "TresPerNode=gres:gpu:1 "
    ),
    (
        "JobId=6 HetJobId=5 HetJobOffset=1 JobName=het.sh HetJobIdSet=5-6 UserId=root(0) GroupId=root(0) "
        "MCS_label=N/A Priority=4294901754 Nice=0 Account=(null) QOS=(null) JobState=COMPLETED Reason=None "
        "Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:04 "
        "TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=2026-11-29T11:46:17 EligibleTime=2026-11-29T11:46:17 "
        "AccrueTime=2026-11-29T11:46:17 StartTime=2026-11-29T11:46:23 EndTime=2026-11-29T11:46:27 "
        "Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-11-29T11:46:23 Scheduler=Backfill "
        "Partition=debug AllocNode:Sid=localhost:2400 ReqNodeList=(null) ExcNodeList=(null) "
        "NodeList=node[2-3] BatchHost=node2 NumNodes=2 NumCPUs=2 NumTasks=2 CPUs/Task=1 ReqB:S:C:T=0:0:*:* "
        "TRES=cpu=2,node=2,billing=2 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 "
        "MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 "
        "Licenses=(null) Network=(null) Command=/tmp/slurmrec/het.sh WorkDir=/tmp/slurmrec "
        "StdErr=/tmp/slurmrec/het-6.out StdIn=/dev/null StdOut=/tmp/slurmrec/het-6.out Power= "
    ),
]
ARRAY_MIXED = [
    (
        "JobId=16 ArrayJobId=16 ArrayTaskId=2-3%2 ArrayTaskThrottle=2 JobName=wrap UserId=root(0) "
        "GroupId=root(0) MCS_label=N/A Priority=4294901747 Nice=0 Account=(null) QOS=(null) JobState=PENDING "
        "Reason=JobArrayTaskLimit Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 "
        "RunTime=00:00:00 TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=2026-11-29T11:48:59 "
        "EligibleTime=Unknown AccrueTime=2026-11-29T11:48:59 StartTime=Unknown EndTime=Unknown Deadline=N/A "
        "SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-11-29T11:49:00 Scheduler=Main Partition=debug "
        "AllocNode:Sid=localhost:2400 ReqNodeList=(null) ExcNodeList=(null) NodeList= NumNodes=1 NumCPUs=1 "
        "NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=1,mem=4000M,node=1,billing=1 Socks/Node=* "
        "NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) "
        "DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) Command=(null) "
        "WorkDir=/tmp/slurmrec StdErr=/tmp/slurmrec/a-16_4294967294.out StdIn=/dev/null "
        "StdOut=/tmp/slurmrec/a-16_4294967294.out Power= "
    ),
    (
        "JobId=18 ArrayJobId=16 ArrayTaskId=1 ArrayTaskThrottle=2 JobName=wrap UserId=root(0) "
        "GroupId=root(0) MCS_label=N/A Priority=4294901747 Nice=0 Account=(null) QOS=(null) JobState=RUNNING "
        "Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 "
        "RunTime=00:00:01 TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=2026-11-29T11:48:59 "
        "EligibleTime=2026-11-29T11:48:59 AccrueTime=2026-11-29T11:48:59 StartTime=2026-11-29T11:49:00 "
        "EndTime=Unknown Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-11-29T11:49:00 "
        "Scheduler=Main Partition=debug AllocNode:Sid=localhost:2400 ReqNodeList=(null) ExcNodeList=(null) "
        "NodeList=node3 BatchHost=node3 NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* "
        "TRES=cpu=1,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 "
        "MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 "
        "Licenses=(null) Network=(null) Command=(null) WorkDir=/tmp/slurmrec StdErr=/tmp/slurmrec/a-16_1.out "
        "StdIn=/dev/null StdOut=/tmp/slurmrec/a-16_1.out Power= "
    ),
    (
        "JobId=17 ArrayJobId=16 ArrayTaskId=0 ArrayTaskThrottle=2 JobName=wrap UserId=root(0) "
        "GroupId=root(0) MCS_label=N/A Priority=4294901747 Nice=0 Account=(null) QOS=(null) JobState=RUNNING "
        "Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 "
        "RunTime=00:00:01 TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=2026-11-29T11:48:59 "
        "EligibleTime=2026-11-29T11:48:59 AccrueTime=2026-11-29T11:48:59 StartTime=2026-11-29T11:49:00 "
        "EndTime=Unknown Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-11-29T11:49:00 "
        "Scheduler=Main Partition=debug AllocNode:Sid=localhost:2400 ReqNodeList=(null) ExcNodeList=(null) "
        "NodeList=node2 BatchHost=node2 NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* "
        "TRES=cpu=1,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 "
        "MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 "
        "Licenses=(null) Network=(null) Command=(null) WorkDir=/tmp/slurmrec StdErr=/tmp/slurmrec/a-16_0.out "
        "StdIn=/dev/null StdOut=/tmp/slurmrec/a-16_0.out Power= "
    ),
]
ARRAY_DONE = [
    (
        "JobId=7 ArrayJobId=7 ArrayTaskId=3 ArrayTaskThrottle=2 JobName=wrap UserId=root(0) GroupId=root(0) "
        "MCS_label=N/A Priority=4294901753 Nice=0 Account=(null) QOS=(null) JobState=COMPLETED Reason=None "
        "Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:03 "
        "TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=2026-11-29T11:46:17 EligibleTime=2026-11-29T11:46:20 "
        "AccrueTime=2026-11-29T11:46:20 StartTime=2026-11-29T11:46:21 EndTime=2026-11-29T11:46:24 "
        "Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-11-29T11:46:21 Scheduler=Backfill "
        "Partition=debug AllocNode:Sid=localhost:2400 ReqNodeList=(null) ExcNodeList=(null) NodeList=node4 "
        "BatchHost=node4 NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* "
        "TRES=cpu=1,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 "
        "MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 "
        "Licenses=(null) Network=(null) Command=(null) WorkDir=/tmp/slurmrec "
        "StdErr=/tmp/slurmrec/arr-7_3.out StdIn=/dev/null StdOut=/tmp/slurmrec/arr-7_3.out Power= "
    ),
    (
        "JobId=11 ArrayJobId=7 ArrayTaskId=2 ArrayTaskThrottle=2 JobName=wrap UserId=root(0) GroupId=root(0) "
        "MCS_label=N/A Priority=4294901753 Nice=0 Account=(null) QOS=(null) JobState=COMPLETED Reason=None "
        "Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:03 "
        "TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=2026-11-29T11:46:17 EligibleTime=2026-11-29T11:46:20 "
        "AccrueTime=2026-11-29T11:46:20 StartTime=2026-11-29T11:46:21 EndTime=2026-11-29T11:46:24 "
        "Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-11-29T11:46:21 Scheduler=Backfill "
        "Partition=debug AllocNode:Sid=localhost:2400 ReqNodeList=(null) ExcNodeList=(null) NodeList=node4 "
        "BatchHost=node4 NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* "
        "TRES=cpu=1,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 "
        "MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 "
        "Licenses=(null) Network=(null) Command=(null) WorkDir=/tmp/slurmrec "
        "StdErr=/tmp/slurmrec/arr-7_2.out StdIn=/dev/null StdOut=/tmp/slurmrec/arr-7_2.out Power= "
    ),
    (
        "JobId=10 ArrayJobId=7 ArrayTaskId=1 ArrayTaskThrottle=2 JobName=wrap UserId=root(0) GroupId=root(0) "
        "MCS_label=N/A Priority=4294901753 Nice=0 Account=(null) QOS=(null) JobState=COMPLETED Reason=None "
        "Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:03 "
        "TimeLimit=365-00:00:00 TimeMin=N/A SubmitTime=2026-11-29T11:46:17 EligibleTime=2026-11-29T11:46:17 "
        "AccrueTime=Unknown StartTime=2026-11-29T11:46:17 EndTime=2026-11-29T11:46:20 Deadline=N/A "
        "SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-11-29T11:46:17 Scheduler=Backfill "
        "Partition=debug AllocNode:Sid=localhost:2400 ReqNodeList=(null) ExcNodeList=(null) NodeList=node4 "
        "BatchHost=node4 NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* "
        "TRES=cpu=1,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 "
        "MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 "
        "Licenses=(null) Network=(null) Command=(null) WorkDir=/tmp/slurmrec "
        "StdErr=/tmp/slurmrec/arr-7_1.out StdIn=/dev/null StdOut=/tmp/slurmrec/arr-7_1.out Power= "
    ),
    (
        "JobId=9 ArrayJobId=7 ArrayTaskId=0 ArrayTaskThrottle=2 JobName=wrap UserId=root(0) GroupId=root(0) "
        "MCS_label=N/A Priority=4294901753 Nice=0 Account=(null) QOS=(null) JobState=COMPLETED Reason=None "
        "Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:03 "
        "TimeLimit=365-00:00:00 TimeMin=N/A SubmitTime=2026-11-29T11:46:17 EligibleTime=2026-11-29T11:46:17 "
        "AccrueTime=Unknown StartTime=2026-11-29T11:46:17 EndTime=2026-11-29T11:46:20 Deadline=N/A "
        "SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-11-29T11:46:17 Scheduler=Backfill "
        "Partition=debug AllocNode:Sid=localhost:2400 ReqNodeList=(null) ExcNodeList=(null) NodeList=node4 "
        "BatchHost=node4 NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* "
        "TRES=cpu=1,node=1,billing=1 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 "
        "MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 "
        "Licenses=(null) Network=(null) Command=(null) WorkDir=/tmp/slurmrec "
        "StdErr=/tmp/slurmrec/arr-7_0.out StdIn=/dev/null StdOut=/tmp/slurmrec/arr-7_0.out Power= "
    ),
]

# Real `squeue -h -t all -O <fields>` output (slurm.py's _SQUEUE_FIELDS) of the same cluster.
SQ_FAILED = ["2|2|N/A|N/A|N/A|FAILED|NonZeroExitCode|768|0|node1|2026-11-29T11:46:17|2026-11-29T11:46:18|"]
SQ_CANCELLED = ["3|3|N/A|N/A|N/A|CANCELLED|None|15|0|node2|2026-11-29T11:46:17|2026-11-29T11:46:18|"]
SQ_HETJOB = [
    "5|5|N/A|5|0|COMPLETED|None|0|0|node1|2026-11-29T11:46:23|2026-11-29T11:46:27|",
    "6|6|N/A|5|1|COMPLETED|None|0|0|node[2-3]|2026-11-29T11:46:23|2026-11-29T11:46:27|",
]
SQ_ARRAY = [
    "7|7|3|N/A|N/A|COMPLETED|None|0|0|node4|2026-11-29T11:46:21|2026-11-29T11:46:24|",
    "11|7|2|N/A|N/A|COMPLETED|None|0|0|node4|2026-11-29T11:46:21|2026-11-29T11:46:24|",
    "10|7|1|N/A|N/A|COMPLETED|None|0|0|node4|2026-11-29T11:46:17|2026-11-29T11:46:20|",
    "9|7|0|N/A|N/A|COMPLETED|None|0|0|node4|2026-11-29T11:46:17|2026-11-29T11:46:20|",
]
SQ_TIMEOUT = ["12|12|N/A|N/A|N/A|TIMEOUT|TimeLimit|15|0|node1|2026-11-29T11:48:46|2026-11-29T11:50:06|"]
SQ_NODE_FAIL = ["13|13|N/A|N/A|N/A|NODE_FAIL|NodeDown|15|0|node4|2026-11-29T11:48:46|2026-11-29T11:48:47|"]
