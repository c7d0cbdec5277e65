"""CPU thread split for CPU-only plans (toolkit.placement.cpus): engines bind their own cores, trainer ranks share the
rest, counted over every process of one machine (nodes with the same address share its cores)."""

from __future__ import annotations

from pathlib import Path

from toolkit.config import load_config
from toolkit.placement import build_plan
from toolkit.placement.cpus import cpu_thread_env
from toolkit.preflight.site import load_site
from toolkit.run.layout import RunDir

JOBS = Path(__file__).resolve().parents[2] / "jobs" / "reverse-text"


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
    assert cpu_thread_env(plan, "inference-0-0", 0, 2) == {"VLLM_CPU_OMP_THREADS_BIND": "0"}
    # 2 cores - 1 for the engine = 1 left for 2 trainer ranks on the same machine: 1 thread each, never 0
    assert cpu_thread_env(plan, "trainer", 1, 2) == {"OMP_NUM_THREADS": "1"}
    assert cpu_thread_env(plan, "trainer", 2, 2) == {"OMP_NUM_THREADS": "1"}
    assert cpu_thread_env(plan, "orchestrator", 0, 2) == {}
    # 16 cores: the engine keeps 15, each rank gets half of the one left (at least 1)
    assert cpu_thread_env(plan, "inference-0-0", 0, 16) == {"VLLM_CPU_OMP_THREADS_BIND": "0-14"}


def test_real_nodes_split_their_own_cores() -> None:
    plan = _slurm_plan(["10.0.0.1", "10.0.0.2", "10.0.0.3"])
    # a trainer node without an engine gives its rank every core
    assert cpu_thread_env(plan, "trainer", 1, 8) == {"OMP_NUM_THREADS": "8"}
    assert cpu_thread_env(plan, "inference-0-0", 0, 8) == {"VLLM_CPU_OMP_THREADS_BIND": "0-6"}


def test_values_set_in_the_config_are_kept() -> None:
    plan = _slurm_plan(["127.0.0.1"] * 3, trainer={"OMP_NUM_THREADS": "2"},
                       inference={"VLLM_CPU_OMP_THREADS_BIND": "1"})
    assert cpu_thread_env(plan, "trainer", 1, 2) == {}
    assert cpu_thread_env(plan, "inference-0-0", 0, 2) == {}


def test_gpu_plans_get_nothing() -> None:
    plan = _slurm_plan(["127.0.0.1"] * 3)
    plan.gpus_per_node = 4
    assert cpu_thread_env(plan, "trainer", 1, 2) == {}



def test_an_inference_only_plan_gives_its_engines_every_core() -> None:
    # srl inference and the eval gate's server: nothing else of the plan runs on the host, so no core is held back
    # (holding one back halved the gate's engine on 2 cores: start-up and sampling took about twice as long).
    cfg = load_config([Path(__file__).resolve().parents[2] / "jobs" / "serve" / "tiny.toml"], purpose="serve").config
    plan = build_plan(cfg, load_site("local"), RunDir(Path("/tmp/srl-cpus-test")), job_id="7",
                      roles=("inference", "router"))
    engines = [p.name for p in plan.processes if p.role == "inference"]
    assert engines and not [p for p in plan.processes if p.role in ("trainer", "orchestrator")]
    assert cpu_thread_env(plan, engines[0], 0, 2) == {"VLLM_CPU_OMP_THREADS_BIND": "0-1"}
    assert cpu_thread_env(plan, engines[0], 0, 16) == {"VLLM_CPU_OMP_THREADS_BIND": "0-15"}
