"""CPU thread split for CPU-only plans (toolkit.placement.cpus): engines bind their own cores, trainer ranks share the
rest, counted over every process of one machine (nodes with the same address share its cores)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from toolkit.config import load_config
from toolkit.placement import build_plan
from toolkit.placement.cpus import (
    affinity_of,
    apply_affinity,
    cpu_thread_env,
    format_cpu_list,
    parse_cpu_list,
)
from toolkit.preflight.site import load_site
from toolkit.run.layout import RunDir

JOBS = Path(__file__).resolve().parents[2] / "jobs" / "reverse-text"


def _engine(cpus: str) -> dict[str, str]:
    """An engine's settings: its OpenMP threads bound to ``cpus``, one per CPU, and its process tree pinned there."""
    threads = str(len(parse_cpu_list(cpus)))
    return {"VLLM_CPU_OMP_THREADS_BIND": cpus, "SRL_CPU_AFFINITY": cpus, "OMP_NUM_THREADS": threads}


def _slurm_plan(addresses: list[str], **env_tables):
    """The Slurm overlay's plan (engine + orchestrator on node 0, a 2-node trainer on nodes 1-2)."""
    cfg = load_config([JOBS / "rl.toml", JOBS / "slurm.toml"]).config
    for role, env in env_tables.items():
        getattr(cfg, role).env_vars.update(env)
    plan = build_plan(cfg, load_site("local-slurm"), RunDir(Path("/tmp/srl-cpus-test")), job_id="7")
    plan.addresses = addresses
    return plan


def test_emulated_nodes_on_one_machine_share_its_cores() -> None:
    plan = _slurm_plan(["127.0.0.1"] * 3)
    assert cpu_thread_env(plan, "inference-0-0", 0, range(2)) == _engine("0")
    # 2 cores - 1 for the engine = 1 left for 2 trainer ranks on the same machine: 1 thread each, never 0
    assert cpu_thread_env(plan, "trainer", 1, range(2)) == {"OMP_NUM_THREADS": "1"}
    assert cpu_thread_env(plan, "trainer", 2, range(2)) == {"OMP_NUM_THREADS": "1"}
    assert cpu_thread_env(plan, "orchestrator", 0, range(2)) == {}
    # 16 cores: the engine keeps 15, each rank gets half of the one left (at least 1)
    assert cpu_thread_env(plan, "inference-0-0", 0, range(16)) == _engine("0-14")


def test_real_nodes_split_their_own_cores() -> None:
    plan = _slurm_plan(["10.0.0.1", "10.0.0.2", "10.0.0.3"])
    # a trainer node without an engine gives its rank every core
    assert cpu_thread_env(plan, "trainer", 1, range(8)) == {"OMP_NUM_THREADS": "8"}
    assert cpu_thread_env(plan, "inference-0-0", 0, range(8)) == _engine("0-6")


def test_values_set_in_the_config_are_kept() -> None:
    plan = _slurm_plan(
        ["127.0.0.1"] * 3, trainer={"OMP_NUM_THREADS": "2"}, inference={"VLLM_CPU_OMP_THREADS_BIND": "1"}
    )
    assert cpu_thread_env(plan, "trainer", 1, range(2)) == {}
    assert cpu_thread_env(plan, "inference-0-0", 0, range(2)) == {}


def test_gpu_plans_get_nothing() -> None:
    plan = _slurm_plan(["127.0.0.1"] * 3)
    plan.gpus_per_node = 4
    assert cpu_thread_env(plan, "trainer", 1, range(2)) == {}


def test_an_inference_only_plan_gives_its_engines_every_core() -> None:
    # srl inference and the eval gate's server: nothing else of the plan runs on the host, so no core is held back
    # (holding one back halved the gate's engine on 2 cores: start-up and sampling took about twice as long).
    cfg = load_config([Path(__file__).resolve().parents[2] / "jobs" / "serve" / "tiny.toml"], purpose="serve").config
    plan = build_plan(
        cfg, load_site("local"), RunDir(Path("/tmp/srl-cpus-test")), job_id="7", roles=("inference", "router")
    )
    engines = [p.name for p in plan.processes if p.role == "inference"]
    assert engines and not [p for p in plan.processes if p.role in ("trainer", "orchestrator")]
    assert cpu_thread_env(plan, engines[0], 0, range(2)) == _engine("0-1")
    assert cpu_thread_env(plan, engines[0], 0, range(16)) == _engine("0-15")


def test_core_positions_map_to_the_cpus_this_process_may_use() -> None:
    # A Slurm allocation of cores 8-15 of a node: the engine binds CPUs 8-14, not 0-6 (outside the allocation).
    plan = _slurm_plan(["10.0.0.1", "10.0.0.2", "10.0.0.3"])
    assert cpu_thread_env(plan, "inference-0-0", 0, range(8, 16)) == _engine("8-14")
    assert cpu_thread_env(plan, "inference-0-0", 0, [1, 3, 5, 7]) == _engine("1,3,5")
    assert cpu_thread_env(plan, "trainer", 1, range(8, 16)) == {"OMP_NUM_THREADS": "8"}


def test_cpu_lists_round_trip_and_bad_ones_name_the_variable() -> None:
    assert format_cpu_list([0]) == "0" and format_cpu_list([2, 3, 4]) == "2-4" and format_cpu_list([8, 10]) == "8,10"
    assert parse_cpu_list("0,2,4-6") == {0, 2, 4, 5, 6}
    assert affinity_of({}) is None and affinity_of({"SRL_CPU_AFFINITY": " 1 "}) == {1}
    for bad in ("a", "3-1", "-1", "1,,2"):
        with pytest.raises(ValueError, match="SRL_CPU_AFFINITY"):
            parse_cpu_list(bad)


def test_a_pinned_child_and_its_children_run_on_the_engine_cores_only() -> None:
    cpu = min(os.sched_getaffinity(0))
    code = (
        "import os, subprocess, sys; print(sorted(os.sched_getaffinity(0))); sys.stdout.flush(); "
        "subprocess.run([sys.executable, '-c', 'import os; print(sorted(os.sched_getaffinity(0)))'])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        preexec_fn=lambda: apply_affinity({cpu}),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    assert out[:2] == [str([cpu]), str([cpu])]
    # CPUs the process may not use are dropped; none left: unchanged
    before = os.sched_getaffinity(0)
    apply_affinity({10_000})
    assert os.sched_getaffinity(0) == before
