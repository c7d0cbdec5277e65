"""A Slurm job's node groups checked against its partitions' limits on the login node (toolkit.preflight.partitions).

Slurm's answers here are recorded ``scontrol show partition -o`` / ``sinfo`` texts, so every limit can be tried
(the local test cluster has one unlimited partition); the real cluster's answers are used by
tests/integration/test_submit_refused_slurm.py.
"""

from __future__ import annotations

import subprocess
from types import SimpleNamespace

import pytest

from toolkit.config.errors import Findings
from toolkit.preflight.partitions import check_partitions, gpus_of, read_partitions

SCONTROL = (
    "PartitionName=debug AllowGroups=ALL Default=YES MaxNodes=UNLIMITED MaxTime=INFINITE State=UP TotalNodes=4 "
    "TRES=cpu=8,mem=16000M,node=4,billing=8\n"
    "PartitionName=short AllowGroups=ALL Default=NO MaxNodes=2 MaxTime=00:30:00 State=UP TotalNodes=3\n"
    "PartitionName=cpu Default=NO MaxNodes=UNLIMITED MaxTime=1-00:00:00 State=DRAIN TotalNodes=8\n"
)
# sinfo -h -N -o "%R %c %G": a line per node and partition
SINFO = (
    "debug 2 gpu:4\ndebug 2 gpu:4\ndebug 2 gpu:4\ndebug 2 gpu:4\nshort 64 gpu:a100:8(S:0-1)\nshort 32 (null)\n"
    "short 128 gpu:a100:4,gpu:v100:2\ncpu 16 (null)\ncpu 16 (null)\n"
)


def slurm(argv: list[str]) -> str:
    if argv[:3] == ["scontrol", "show", "partition"]:
        return SCONTROL
    assert argv == ["sinfo", "-h", "-N", "-o", "%R %c %G"], argv
    return SINFO


def _plan(*groups) -> SimpleNamespace:
    return SimpleNamespace(
        groups=[
            SimpleNamespace(index=i, num_nodes=n, gpus_per_node=g, partition=p, cpus_per_node=None)
            for i, (n, g, p) in enumerate(groups)
        ]
    )


def _check(time: str, *groups) -> Findings:
    f = Findings()
    check_partitions(SimpleNamespace(slurm=SimpleNamespace(time=time)), _plan(*groups), f, run=slurm)
    return f


def _texts(items) -> list[str]:
    return [f"{i.path}: {i.message}" for i in items]


def test_gres_texts():
    assert gpus_of("gpu:4") == 4 and gpus_of("gpu:a100:8(S:0-1)") == 8 and gpus_of("(null)") == 0
    assert gpus_of("gpu:a100:4,gpu:v100:2") == 6 and gpus_of("shard:8,gpu:2") == 2


def test_partitions_are_read_with_their_limits():
    p = read_partitions(slurm)
    assert sorted(p) == ["cpu", "debug", "short"]
    assert (
        p["debug"].max_time_s,
        p["debug"].max_nodes,
        p["debug"].total_nodes,
        p["debug"].gpus_per_node,
        p["debug"].default,
    ) == (None, None, 4, 4, True)
    assert (p["short"].max_time_s, p["short"].max_nodes, p["short"].gpus_per_node) == (1800, 2, 8)
    assert p["cpu"].max_time_s == 86400 and p["cpu"].state == "DRAIN" and p["cpu"].gpus_per_node == 0
    assert p["short"].node_shapes == ((64, 8), (32, 0), (128, 6)) and p["debug"].most_cpus(4) == 2
    assert (p["short"].most_cpus(0), p["short"].most_cpus(8), p["short"].most_cpus(9)) == (128, 64, 0)


def test_a_job_that_fits_passes():
    f = _check("04:00:00", (3, 4, None), (1, 0, "cpu"))
    assert not f.errors, _texts(f.errors)
    assert _texts(f.warnings) == [
        (
            "deployment.orchestrator_partition: partition 'cpu' (the orchestrator's component) is DRAIN: the job will "
            "wait until it is UP"
        )
    ]


@pytest.mark.parametrize(
    ("time", "groups", "path", "text"),
    [
        (
            "04:00:00",
            [(1, 0, "nosuch")],
            "slurm.partition",
            "partition 'nosuch' does not exist on this cluster; partitions: cpu, debug, short",
        ),
        ("04:00:00", [(5, 4, None)], "deployment", "the job needs 5 nodes in partition 'debug', which has at most 4"),
        (
            "00:10:00",
            [(3, 0, "short")],
            "deployment",
            ("the job needs 3 nodes in partition 'short', which has at most 2 (MaxNodes)"),
        ),
        (
            "00:10:00",
            [(2, 16, "short")],
            "deployment.gpus_per_node",
            "16 GPUs per node requested but no node of partition 'short' has more than 8",
        ),
        (
            "01:00:00",
            [(1, 0, "short")],
            "slurm.time",
            ("01:00:00 is longer than partition 'short' allows (00:30:00, MaxTime)"),
        ),
        (
            "04:00:00",
            [(1, 0, None), (1, 0, "gone")],
            "deployment.orchestrator_partition",
            "partition 'gone' does not exist",
        ),
    ],
)
def test_what_the_partition_can_never_run_is_refused_naming_the_field(time, groups, path, text):
    f = _check(time, *groups)
    assert any(i.path == path and text in i.message for i in f.errors), _texts(f.errors)


def test_no_default_partition_and_unreachable_slurm():
    global SCONTROL
    saved = SCONTROL
    try:
        SCONTROL = SCONTROL.replace("Default=YES", "Default=NO")
        assert "no partition is named and the cluster has no default one" in _texts(_check("1", (1, 0, None)).errors)[0]
    finally:
        SCONTROL = saved

    def down(argv):
        raise subprocess.SubprocessError("slurm_load_partitions error: Unable to contact slurm controller")

    f = Findings()
    check_partitions(SimpleNamespace(slurm=SimpleNamespace(time="1")), _plan((99, 99, "x")), f, run=down)
    assert not f.errors and "partition limits are not checked here" in f.warnings[0].message


def test_the_cached_answer_is_not_used_once_slurm_is_replaced(monkeypatch):
    # A process that asked the real Slurm keeps its answer; a runner put in its place is asked instead.
    from toolkit.preflight import partitions

    monkeypatch.setattr(partitions, "_run", slurm)
    monkeypatch.setattr(partitions, "_live", None)
    assert sorted(partitions._live_partitions()) == ["cpu", "debug", "short"]

    def down(argv):
        raise FileNotFoundError("scontrol is not on PATH")

    monkeypatch.setattr(partitions, "_run", down)
    f = Findings()
    check_partitions(SimpleNamespace(slurm=SimpleNamespace(time="1")), _plan((1, 0, "gpu")), f)
    assert not f.errors and "partition limits are not checked here" in f.warnings[0].message


def test_the_elastic_replicas_partition_and_time_limit_are_checked_with_the_run():
    def check(partition, time):
        f = Findings()
        cfg = SimpleNamespace(
            slurm=SimpleNamespace(time="01:00:00"),
            deployment=SimpleNamespace(elastic=SimpleNamespace(partition=partition, time=time)),
        )
        check_partitions(cfg, _plan((1, 0, "debug")), f, run=slurm)
        return _texts(f.errors)

    assert check("short", "00:20:00") == [] and check(None, "9:00:00") == []
    assert check("spot", "00:20:00") == [
        "deployment.elastic.partition: partition 'spot' does not exist on this cluster; partitions: cpu, debug, short"
    ]
    assert check("short", "01:00:00") == [
        "deployment.elastic.time: 01:00:00 is longer than partition 'short' allows (00:30:00, MaxTime)"
    ]


def test_more_cores_per_node_than_any_node_has_is_refused():
    """The site's ``[cpus]`` request (the plan's ``cpus_per_node``) against the partition's largest node: a job
    sbatch would refuse ("Requested node configuration is not available") is refused before anything is written."""

    def checked(*groups) -> Findings:
        plan = SimpleNamespace(
            groups=[
                SimpleNamespace(index=i, num_nodes=n, gpus_per_node=g, partition=p, cpus_per_node=c)
                for i, (n, g, p, c) in enumerate(groups)
            ]
        )
        f = Findings()
        check_partitions(SimpleNamespace(slurm=SimpleNamespace(time="00:20:00")), plan, f, run=slurm)
        return f

    assert not checked((2, 4, None, 2), (1, 0, "cpu", 16)).errors
    assert not checked((1, 0, "short", 128)).errors and not checked((1, 8, "short", 64)).errors
    # The CPUs must be on a node with the GPUs: short's 128-core node has 6 GPUs, its 8-GPU node 64 cores.
    [e] = _texts(checked((1, 8, "short", 128)).errors)
    assert e.startswith("site [cpus]: 128 cores per node requested (--cpus-per-task) but no node with 8 GPUs of "), e
    f = checked((2, 4, None, 8), (1, 0, "cpu", 32))
    fix = "a smaller per_gpu / without_gpus in the site file, or a CPU option in slurm.extra_directives"
    assert _texts(f.errors) == [
        (
            "site [cpus]: 8 cores per node requested (--cpus-per-task) but no node with 4 GPUs of partition "
            f"'debug' has more than 2 CPUs; {fix}"
        ),
        (
            "site [cpus]: 32 cores per node requested (--cpus-per-task) but no node of partition 'cpu' (the "
            f"orchestrator's component) has more than 16 CPUs; {fix}"
        ),
    ]
