"""Placement plan: node layout, GPU positions, ports, rendezvous, environment layers (field cases B03, B05, B07,
B08, B09, B29, B30)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from golden.layouts import LAYOUTS, make_cfg, merge, multi

from toolkit.config import ConfigError
from toolkit.engines.commands import WORKER_EXTENSION_CLS
from toolkit.placement import GpuBindingError, Plan, build_plan, fill, read_plan, visible_devices, write_plan
from toolkit.placement.runtime import ResolveError, group_hostlists, node_addresses
from toolkit.preflight.site import load_site
from toolkit.run.layout import RunDir

PI = load_site("prime-intellect")


def plan_for(layout_or_over, site=PI, job_id="1001", **kw) -> Plan:
    over = LAYOUTS[layout_or_over] if isinstance(layout_or_over, str) else layout_or_over
    cfg = make_cfg(over, site=site.name, **kw)
    return build_plan(cfg, site, RunDir(cfg.output_dir / cfg.run.name), job_id=job_id)


def test_b03_gpu_positions_index_the_granted_set() -> None:
    plan = plan_for("single-node")
    infer = [p for p in plan.processes if p.role == "inference"]
    trainer = plan.process("trainer")
    granted = "2,5,7,9,11,12,14,15"
    assert [visible_devices(p.gpus, granted, 8) for p in infer] == ["2,5", "7,9"]
    assert visible_devices(trainer.gpus, granted, 8) == "11,12,14,15"
    # the B03 trigger itself: 2 inference + 2 trainer GPUs on a node that granted 2,5,7,9
    assert visible_devices((0, 1), "2,5,7,9", 4) == "2,5"
    assert visible_devices((2, 3), "2,5,7,9", 4) == "7,9"
    with pytest.raises(GpuBindingError, match=r"4 GPUs\) but only 2 are visible"):
        visible_devices((2, 3), "2,5", 4)


def test_b03_more_gpus_than_the_node_has_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="6 \\+ 4 = 10 GPUs > gpus_per_node 8"):
        make_cfg(
            site="prime-intellect",
            deployment={"type": "single_node", "gpus_per_node": 8, "num_infer_gpus": 4, "num_train_gpus": 6},
        )


def test_b05_ports_differ_between_jobs_and_services_and_avoid_defaults() -> None:
    over = {
        "run": {"name": "b05"},
        "deployment": {"type": "single_node", "gpus_per_node": 8, "num_infer_gpus": 4, "num_train_gpus": 4},
        "inference": {"deployment": {"type": "single_node", "num_replicas": 4}},
    }
    a, b = plan_for(over, job_id="1001"), plan_for(over, job_id="1002")
    assert len(set(a.ports.values())) == len(a.ports)
    assert set(a.ports.values()).isdisjoint(b.ports.values())
    for plan in (a, b):
        assert not {29500, 8000} & set(plan.ports.values())
        assert all(PI.ports.range_start <= p < PI.ports.range_end for p in plan.ports.values())
    assert {"trainer.rdzv", "router.http", "inference-0-0.http", "inference-0-3.http"} <= set(a.ports)


def test_b05_ports_written_to_the_run_dir(tmp_path: Path) -> None:
    cfg = make_cfg(LAYOUTS["train2-infer1"], site="prime-intellect", output_dir=str(tmp_path))
    run = RunDir(tmp_path / cfg.run.name)
    plan = build_plan(cfg, PI, run, job_id=77)
    write_plan(run, plan)
    ports = json.loads(run.ports_file.read_text())
    assert ports["job_id"] == "77"
    assert ports["services"]["trainer.rdzv"]["port"] == plan.ports["trainer.rdzv"]
    assert read_plan(run) == plan


def test_b07_head_host_from_python_hostlist_expansion_without_scontrol(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no scontrol on PATH (the container step)
    hosts = group_hostlists({"SLURM_JOB_NODELIST": "gpu-[01-02]", "SLURM_NNODES": "2"}, 1)
    assert hosts == [["gpu-01", "gpu-02"]]
    assert node_addresses(hosts[0]) == ["gpu-01", "gpu-02"]  # host names, never localhost
    with pytest.raises(ResolveError, match="SLURM_JOB_NODELIST is not set"):
        group_hostlists({}, 1)
    with pytest.raises(ResolveError, match="cannot expand"):
        group_hostlists({"SLURM_JOB_NODELIST": "gpu-[01-"}, 1)


def test_b07_master_is_the_first_trainer_host() -> None:
    plan = plan_for("train2-infer1")
    plan.addresses = ["gpu-01", "gpu-02", "gpu-03"]
    trainer = plan.process("trainer")
    assert plan.master_node == trainer.node_index == 1
    argv = [fill(a, plan, 1) for a in trainer.command]
    assert f"gpu-02:{trainer.ports['rdzv']}" in argv
    assert fill(trainer.env["MASTER_ADDR"], plan, 2) == "gpu-02"


def test_b07_user_master_addr_is_rejected() -> None:
    with pytest.raises(ConfigError, match="MASTER_ADDR is set by srl"):
        make_cfg(LAYOUTS["train2-infer1"], site="prime-intellect", env_vars={"MASTER_ADDR": "localhost"})


def test_b08_side_channel_host_is_the_node_address_and_ports_distinct_per_host() -> None:
    over = {
        "run": {"name": "b08"},
        "deployment": multi(1, 2, gpus_per_node=8),
        "inference": {
            "vllm": {"tensor_parallel_size": 4},
            "deployment": {"type": "disaggregated", "kv_connector": "NixlConnector"},
        },
    }
    plan = plan_for(over)
    plan.addresses = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    workers = [p for p in plan.processes if p.kv_role]
    assert {p.kv_role for p in workers} == {"kv_producer", "kv_consumer"}
    by_node: dict[int, list[int]] = {}
    for p in workers:
        host = fill(p.env["VLLM_NIXL_SIDE_CHANNEL_HOST"], plan, p.node_index)
        assert host == plan.addresses[p.node_index]
        base = int(p.env["VLLM_NIXL_SIDE_CHANNEL_PORT"])
        by_node.setdefault(p.node_index, []).extend(range(base, base + len(p.gpus)))
        assert "kv_producer" in " ".join(p.command) or "kv_consumer" in " ".join(p.command)
    for ports in by_node.values():
        assert len(ports) == len(set(ports))


def test_gpu_engines_keep_vllms_chunked_prefill_and_a_user_value_wins_on_cpu() -> None:
    gpu = plan_for(
        {
            "run": {"name": "gp"},
            "deployment": {"type": "single_node", "gpus_per_node": 8, "num_infer_gpus": 1, "num_train_gpus": 4},
        }
    )
    eng = next(p for p in gpu.processes if p.role == "inference")
    assert not any("chunked-prefill" in t for t in eng.command) and "--enforce-eager" not in eng.command
    cpu = plan_for(
        {"run": {"name": "cp"}, "inference": {"vllm": {"enable_chunked_prefill": True}}},
        site=load_site("local"),
        job_id="local",
    )
    eng = next(p for p in cpu.processes if p.role == "inference")
    assert "--enable-chunked-prefill" in eng.command and "--no-enable-chunked-prefill" not in eng.command


def test_b08_colocated_prefill_and_decode_never_share_a_side_channel_port() -> None:
    over = {
        "run": {"name": "b08s"},
        "deployment": {"type": "single_node", "gpus_per_node": 8, "num_infer_gpus": 4, "num_train_gpus": 4},
        "inference": {
            "vllm": {"tensor_parallel_size": 2},
            "deployment": {"type": "disaggregated", "kv_connector": "NixlConnector"},
        },
    }
    # single-node P/D: both roles on node 0; every port of every process differs
    plan = plan_for(over)
    all_ports = [v for p in plan.processes for v in p.ports.values()]
    assert len(all_ports) == len(set(all_ports))


@pytest.mark.parametrize(
    ("connector", "dialect"),
    [("NixlConnector", "nixl"), ("MooncakeConnector", "mooncake"), ("LMCacheConnectorV1", "nixl")],
)
def test_router_speaks_the_p_d_dialect_of_the_deployments_connector(connector: str, dialect: str) -> None:
    over = {
        "run": {"name": "pd"},
        "deployment": multi(1, 2, gpus_per_node=8),
        "inference": {
            "vllm": {"tensor_parallel_size": 4},
            "deployment": {"type": "disaggregated", "kv_connector": connector},
        },
    }
    (router,) = [p for p in plan_for(over).processes if p.role == "router"]
    argv = list(router.command)
    assert "--vllm-pd-disaggregation" in argv and argv[argv.index("--kv-connector") + 1] == dialect


def test_b09_jit_caches_on_node_local_scratch_per_job_unless_overridden() -> None:
    hpc = load_site("generic-hpc")
    over = dict(
        LAYOUTS["train2-infer1"],
        deployment=multi(2, 1, gpus_per_node=4),
        inference={"vllm": {"tensor_parallel_size": 4}},
    )
    plan = plan_for(over, site=hpc, job_id="4242", slurm={"account": "p1"})
    for p in plan.processes:
        assert p.env["TRITON_CACHE_DIR"] == "$TMPDIR/srl-4242/triton"
        assert "TRITON_CACHE_DIR" in p.node_expand
        assert p.env["TORCHINDUCTOR_CACHE_DIR"].endswith("srl-4242/inductor")
    mine = plan_for(
        over,
        site=hpc,
        job_id="4242",
        slurm={"account": "p1"},
        trainer={"env_vars": {"TRITON_CACHE_DIR": "/local/mine"}},
    )
    assert mine.process("trainer").env["TRITON_CACHE_DIR"] == "/local/mine"
    assert "TRITON_CACHE_DIR" not in mine.process("trainer").node_expand


def test_b09_cache_dir_on_shared_home_warns() -> None:
    from config_cases import validate
    from golden.layouts import BASE, merge

    loaded = validate(merge(BASE, {"site": "prime-intellect", "env_vars": {"TRITON_CACHE_DIR": "~/.triton"}}))
    assert any("shared filesystem" in w.message for w in loaded.warnings)


def test_b29_orchestrator_gets_data_parallel_size() -> None:
    over = {
        "run": {"name": "b29"},
        "deployment": multi(2, 1),
        "trainer": {"tp": 2, "cp": 1},
        "inference": {"vllm": {"tensor_parallel_size": 8}},
    }
    plan = plan_for(over)
    assert plan.trainer_dp == 8
    assert plan.process("orchestrator").env["SRL_TRAINER_DP"] == "8"
    with pytest.raises(ConfigError, match="3 x 1 = 3 does not divide the 16 trainer GPUs"):
        make_cfg(dict(over, trainer={"tp": 3}), site="prime-intellect")


def test_b30_disaggregated_node_count_from_nodes_per_replica() -> None:
    pd = {
        "type": "disaggregated",
        "num_prefill_replicas": 1,
        "prefill_nodes_per_replica": 1,
        "num_decode_replicas": 1,
        "decode_nodes_per_replica": 2,
    }
    over = {"run": {"name": "b30"}, "deployment": multi(2, 3), "inference": {"deployment": pd}}
    plan = plan_for(over)
    assert plan.num_nodes == 5
    nodes = {p.name: p.node_indices for p in plan.processes}
    assert nodes["prefill-0-0-0"] == (0,)
    assert nodes["decode-0-0"] == (1, 2)
    assert nodes["trainer"] == (3, 4)
    with pytest.raises(ConfigError, match="deployment.nodes = 4, but the layout needs 5 nodes"):
        make_cfg(dict(over, deployment=multi(2, 3, nodes=4)), site="prime-intellect")


def test_environment_layers_and_owned_values() -> None:
    over = {
        "run": {"name": "envl"},
        "deployment": multi(1, 2),
        "env_vars": {"A": "global", "B": "global"},
        "inference": {
            "vllm": {"tensor_parallel_size": 8},
            "env_vars": {"B": "component", "C": "component"},
            "deployment": {"type": "disaggregated", "prefill_env_vars": {"C": "prefill"}},
        },
    }
    plan = plan_for(over)
    pre = next(p for p in plan.processes if p.kv_role == "kv_producer")
    dec = next(p for p in plan.processes if p.kv_role == "kv_consumer")
    assert (pre.env["A"], pre.env["B"], pre.env["C"]) == ("global", "component", "prefill")
    assert dec.env["C"] == "component"
    assert plan.process("trainer").env["B"] == "global"
    assert pre.env["SRL_PROCESS"] == pre.name and pre.env["VLLM_SERVER_DEV_MODE"] == "1"
    with pytest.raises(ConfigError, match="VLLM_NIXL_SIDE_CHANNEL_HOST is set by srl"):
        make_cfg(
            dict(
                over,
                inference={
                    "deployment": {
                        "type": "disaggregated",
                        "decode_env_vars": {"VLLM_NIXL_SIDE_CHANNEL_HOST": "localhost"},
                    }
                },
            ),
            site="prime-intellect",
        )


def test_local_site_everything_on_node_zero() -> None:
    local = load_site("local")
    plan = plan_for(
        {"run": {"name": "loc"}, "inference": {"deployment": {"type": "single_node", "num_replicas": 2}}},
        site=local,
        job_id="local",
    )
    assert {p.node_index for p in plan.processes} == {0}
    assert [p.name for p in plan.processes] == ["inference-0-0", "inference-0-1", "router", "trainer", "orchestrator"]
    assert plan.process("trainer").command[:2] == ["srl", "trainer"]
    assert all(p.gpus == () for p in plan.processes)
    plan.addresses = ["127.0.0.1"]
    assert fill(plan.process("orchestrator").env["SRL_INFERENCE_URL"], plan, 0).startswith("http://127.0.0.1:")
    eng = plan.process("inference-0-0")
    assert "--enforce-eager" in eng.command and "{model_path}" in eng.command
    # CPU engines never split a prefill: vLLM-CPU dies on a seeded request whose prefill is split
    assert "--no-enable-chunked-prefill" in eng.command
    assert eng.healthcheck_url.endswith("/health")
    # Sampling logprobs of the sampling distribution, srl's fast weight reload, the config's dtype.
    after = {
        flag: eng.command[eng.command.index(flag) + 1]
        for flag in ("--max-logprobs", "--logprobs-mode", "--worker-extension-cls", "--dtype")
    }
    assert after == {
        "--max-logprobs": "20",
        "--logprobs-mode": "processed_logprobs",
        "--worker-extension-cls": WORKER_EXTENSION_CLS,
        "--dtype": "float32",
    }


def test_multi_rank_trainer_uses_torchrun_one_task_per_node() -> None:
    plan = plan_for("train2-infer1")
    t = plan.process("trainer")
    assert t.command[0] == "torchrun" and t.num_nodes == 2 and t.nprocs_per_node == 8
    assert t.command[t.command.index("--nproc-per-node") + 1] == "8"
    assert "29500" not in " ".join(t.command)


def test_multi_node_trainer_rendezvous_gives_up_within_the_deployment_timeout() -> None:
    from argv_checks import argv_problems

    t = plan_for("train2-infer1").process("trainer")
    assert t.command[t.command.index("--rdzv-conf") + 1] == "join_timeout=300,read_timeout=60"  # the default
    over = merge(LAYOUTS["train2-infer1"], {"deployment": {"trainer_rendezvous_timeout_s": 15}})
    t = plan_for(over).process("trainer")
    # A short timeout also shortens torchrun's wait for the store on the first trainer node (2 tries of it).
    assert t.command[t.command.index("--rdzv-conf") + 1] == "join_timeout=15,read_timeout=7"
    argv = [a.replace("{master_addr}", "10.0.0.1") for a in t.command]
    assert argv_problems([argv]) == []  # torchrun's own parser and rendezvous settings accept it
    # One node: nobody to wait for, torchrun's defaults stand.
    single = plan_for(
        {"run": {"name": "loc"}, "deployment": {"type": "single_node", "cpu_train_ranks": 2}},
        site=load_site("local"),
        job_id="local",
    ).process("trainer")
    assert single.command[0] == "torchrun" and "--rdzv-conf" not in single.command


@pytest.mark.parametrize("bad", [0, -5, 1.5, "soon", True])
def test_trainer_rendezvous_timeout_must_be_whole_positive_seconds(bad) -> None:
    over = merge(LAYOUTS["train2-infer1"], {"deployment": {"trainer_rendezvous_timeout_s": bad}})
    with pytest.raises(ConfigError, match=r"deployment\.(multi_node\.)?trainer_rendezvous_timeout_s"):
        make_cfg(over)


def test_cpu_node_trainer_ranks_from_cpu_train_ranks() -> None:
    # The embedded default has no GPUs; gloo ranks under torchrun let FSDP2 and rank faults be exercised there.
    local = load_site("local")
    plan = plan_for(
        {"run": {"name": "loc"}, "deployment": {"type": "single_node", "cpu_train_ranks": 2}},
        site=local,
        job_id="local",
    )
    t = plan.process("trainer")
    assert t.command[0] == "torchrun" and t.nprocs_per_node == 2 and t.num_nodes == 1 and t.gpus == ()
    assert t.command[t.command.index("--nproc-per-node") + 1] == "2"
    with pytest.raises(ConfigError, match="deployment.cpu_train_ranks"):
        make_cfg(
            {
                "deployment": {
                    "type": "single_node",
                    "gpus_per_node": 8,
                    "num_train_gpus": 4,
                    "num_infer_gpus": 4,
                    "cpu_train_ranks": 2,
                }
            },
            site="prime-intellect",
        )


def test_hetjob_orchestrator_on_its_own_cpu_group() -> None:
    plan = plan_for("hetjob-orchestrator")
    assert [(g.num_nodes, g.gpus_per_node, g.partition) for g in plan.groups] == [(2, 8, "cluster"), (1, 0, "cpu")]
    o = plan.process("orchestrator")
    assert (o.het_group, o.node_index) == (1, 2)


def test_external_inference_places_no_engines() -> None:
    over = dict(LAYOUTS["train2-infer1"], inference={"vllm": {"tensor_parallel_size": 8}, "external": "/shared/inf"})
    plan = plan_for(over)
    assert {p.role for p in plan.processes} == {"trainer", "orchestrator"}
    assert plan.num_nodes == 2 and plan.process("trainer").node_indices == (0, 1)
    assert plan.process("orchestrator").env["SRL_INFERENCE_RUN_DIR"] == "/shared/inf"


def test_inference_only_plan() -> None:
    cfg = make_cfg(LAYOUTS["infer2-replicas"], site="prime-intellect")
    plan = build_plan(cfg, PI, RunDir("/shared/runs/x"), job_id=5, roles=("inference", "router"))
    assert {p.role for p in plan.processes} == {"inference", "router"}
    assert plan.num_nodes == 2


def test_engine_spanning_two_nodes_runs_headless_on_the_second() -> None:
    from toolkit.engines.multinode import node_engine_argv

    over = {
        "run": {"name": "mn"},
        "deployment": multi(1, 2, num_infer_replicas=1),
        "inference": {"vllm": {"tensor_parallel_size": 4}, "deployment": {"type": "multi_node", "num_nodes": 2}},
    }
    plan = plan_for(over)
    plan.addresses = [f"10.0.0.{i + 1}" for i in range(plan.num_nodes)]
    (eng,) = [p for p in plan.processes if p.role == "inference"]
    assert eng.node_indices == (0, 1)
    head = node_engine_argv([fill(a, plan, 0, "/m") for a in eng.command], eng.node_indices, 0)
    second = node_engine_argv([fill(a, plan, 1, "/m") for a in eng.command], eng.node_indices, 1)
    flag = lambda argv, f: argv[argv.index(f) + 1]
    assert "vllm.entrypoints.openai.api_server" in head and "--headless" not in head
    assert flag(head, "--data-parallel-size") == "4" and flag(head, "--data-parallel-size-local") == "2"
    assert second[second.index("vllm.entrypoints.cli.main") + 1] == "serve"
    assert flag(second, "--data-parallel-start-rank") == "2" and "--headless" in second
    assert "--port" not in second and "--host" not in second
    # both point at the head node's address and the same RPC port
    assert flag(second, "--data-parallel-address") == flag(head, "--data-parallel-address") == "10.0.0.1"
    assert flag(second, "--data-parallel-rpc-port") == flag(head, "--data-parallel-rpc-port")
    assert node_engine_argv(head, (0,), 0) == head
    with pytest.raises(ValueError, match="not one of the engine's nodes"):
        node_engine_argv(head, eng.node_indices, 5)


def test_local_jit_caches_persist_in_one_private_directory_per_user(tmp_path: Path) -> None:
    """Local runs share one per-user cache directory under node-local scratch (a warm vLLM cache starts engines
    faster); Slurm jobs keep per-job caches (the test above). The directory is refused unless it is this user's
    alone: compiled kernels are executed from there."""
    import os
    import stat

    from toolkit.placement.environment import local_cache_root, private_cache_root

    plan = plan_for("single-node", site=load_site("local"), job_id="local-abc-1")
    want = f"/tmp/srl-cache-{os.getuid()}"
    assert want == local_cache_root("/tmp/")
    assert {p.env["VLLM_CACHE_ROOT"] for p in plan.processes} == {f"{want}/vllm"}
    assert all("VLLM_CACHE_ROOT" not in p.node_expand for p in plan.processes)

    mine = tmp_path / "srl-cache-x"
    private_cache_root(mine)
    private_cache_root(mine)  # an existing directory of one's own is accepted
    assert stat.S_IMODE(mine.stat().st_mode) == 0o700
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(PermissionError, match=f"{shared}.*only you"):
        private_cache_root(shared)
    (tmp_path / "link").symlink_to(mine)
    with pytest.raises(PermissionError, match="link"):
        private_cache_root(tmp_path / "link")
    (tmp_path / "file").write_text("")
    with pytest.raises(PermissionError, match="file"):
        private_cache_root(tmp_path / "file")
    other = tmp_path / "other"
    other.mkdir(mode=0o700)
    os.chown(other, 12345, 12345)  # a directory another user made first (the tests run as root)
    with pytest.raises(PermissionError, match="other"):
        private_cache_root(other)


def _served_opd(model: Path, **teacher) -> dict:
    (model / "config.json").parent.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text("{}")  # what the login-node check looks for
    return {"train": {"algo": {"type": "opd", "teacher": {"serve": True, "name": str(model), **teacher}}}}


def test_a_served_teacher_is_an_engine_of_the_plan_whose_url_reaches_the_orchestrator(tmp_path: Path) -> None:
    local = load_site("local")
    model = tmp_path / "sft" / "model"
    plan = plan_for({"run": {"name": "opd"}}, site=local, job_id="local", orchestrator=_served_opd(model))
    assert [p.name for p in plan.processes] == ["inference-0-0", "teacher-0", "trainer", "orchestrator"]
    t = plan.process("teacher-0")
    assert t.role == "teacher" and t.node_index == 0 and t.gpus == () and t.log_name == "teacher-0.log"
    at = {flag: t.command[t.command.index(flag) + 1] for flag in ("--model", "--served-model-name", "--port")}
    assert at == {"--model": str(model), "--served-model-name": str(model), "--port": str(t.ports["http"])}
    # scoring needs vLLM's prompt logprobs of up to 20 tokens; never a LoRA adapter or the policy's weight updates
    assert t.command[t.command.index("--max-logprobs") + 1] == "20" and "--enable-lora" not in t.command
    assert t.ports["http"] not in plan.process("inference-0-0").ports.values()
    plan.addresses = ["127.0.0.1"]
    url = fill(plan.process("orchestrator").env["SRL_TEACHER_URL_0"], plan, 0)
    assert url == f"http://127.0.0.1:{t.ports['http']}/v1"
    assert fill(t.healthcheck_url, plan, 0) == f"http://127.0.0.1:{t.ports['http']}/health"
    # an inference-only plan of the same config (srl inference) has no orchestrator and so no teacher
    cfg = make_cfg({"run": {"name": "opd"}}, site="local", orchestrator=_served_opd(model))
    alone = build_plan(cfg, local, RunDir(cfg.output_dir / "opd"), roles=("inference", "router"))
    assert [p.role for p in alone.processes] == ["inference"]


def test_a_served_teacher_takes_the_gpus_after_the_policy_and_the_trainer(tmp_path: Path) -> None:
    over = {
        "run": {"name": "opd-gpu"},
        "deployment": {"type": "single_node", "gpus_per_node": 8, "num_infer_gpus": 2, "num_train_gpus": 4},
        "inference": {"deployment": {"type": "single_node", "num_replicas": 2}},
    }
    model = tmp_path / "model"
    plan = plan_for(over, orchestrator=_served_opd(model, tp=2))
    t = plan.process("teacher-0")
    assert t.gpus == (6, 7) and t.command[t.command.index("--tensor-parallel-size") + 1] == "2"
    assert visible_devices(t.gpus, "0,1,2,3,4,5,6,7", 8) == "6,7"
    with pytest.raises(ConfigError, match=r"teacher.tp.*the served teachers' tp = 9 GPUs > gpus_per_node 8"):
        make_cfg(over, site="prime-intellect", orchestrator=_served_opd(model, tp=3))


def test_a_multi_node_run_serves_its_teacher_in_a_het_group_of_its_own(tmp_path: Path) -> None:
    model = tmp_path / "model"
    hetorch = merge(LAYOUTS["train2-infer1"], {"deployment": {"orchestrator_partition": "cpu"}})
    for over, het in ((LAYOUTS["train2-infer1"], 1), (hetorch, 2)):
        plan = plan_for(over, orchestrator=_served_opd(model, tp=4))
        t = plan.process("teacher-0")
        first = plan.groups[0].num_nodes + (1 if het == 2 else 0)
        assert (t.het_group, t.node_index, t.gpus) == (het, first, (0, 1, 2, 3))
        g = plan.groups[het]
        assert (g.index, g.num_nodes, g.gpus_per_node, g.first_node) == (het, 1, 4, first)
        assert (
            plan.process("orchestrator").env["SRL_TEACHER_URL_0"]
            == f"http://{{node_addr_{first}}}:{t.ports['http']}/v1"
        )
    with pytest.raises(ConfigError, match=r"teacher.tp: a served teacher's tp 9 > deployment.gpus_per_node 8"):
        make_cfg(LAYOUTS["train2-infer1"], site="prime-intellect", orchestrator=_served_opd(model, tp=9))
    # with the policy's engines in another allocation (inference.external), the nodes shift down, the URL too
    ext = merge(LAYOUTS["train2-infer1"], {"inference": {"external": str(tmp_path / "serve")}})
    (tmp_path / "serve").mkdir()
    plan = plan_for(ext, orchestrator=_served_opd(model))
    t = plan.process("teacher-0")
    assert t.node_index == plan.groups[1].first_node == plan.groups[0].num_nodes == 2
    assert plan.process("orchestrator").env["SRL_TEACHER_URL_0"] == f"http://{{node_addr_2}}:{t.ports['http']}/v1"


def _two_envs(a: dict, b: dict) -> dict:
    envs = [
        {"name": "one", "taskset": {"id": "srl-reverse-text"}, "algo": a},
        {"name": "two", "taskset": {"id": "srl-arith"}, "algo": b},
    ]
    return {"train": {"env": envs}}


def test_envs_naming_one_teacher_two_ways_share_its_engine_and_must_agree_on_its_tp(
    tmp_path: Path, monkeypatch
) -> None:
    model = tmp_path / "sft" / "model"
    _served_opd(model)  # writes its config.json
    monkeypatch.chdir(tmp_path)
    local = load_site("local")
    same = {"type": "opd", "teacher": {"serve": True, "name": str(model)}}
    alias = {"type": "opd", "teacher": {"serve": True, "name": "./sft/../sft/model/"}}
    plan = plan_for({"run": {"name": "two"}}, site=local, job_id="local", orchestrator=_two_envs(same, alias))
    assert [p.name for p in plan.processes if p.role == "teacher"] == ["teacher-0"]  # one directory, one engine
    with pytest.raises(ConfigError, match=r"env\[1\].algo.teacher.tp.*2, but orchestrator.train.env\[0\].algo.teacher"):
        make_cfg(
            {"run": {"name": "two"}},
            site="local",
            orchestrator=_two_envs(same, {**alias, "teacher": {**alias["teacher"], "tp": 2}}),
        )


def test_a_multi_node_runs_served_teacher_counts_toward_the_sites_node_limit(tmp_path: Path) -> None:
    model = tmp_path / "model"
    three = {"type": "multi_node", "gpus_per_node": 0, "num_train_nodes": 2, "orchestrator": "with_inference"}
    make_cfg({"run": {"name": "fits"}, "deployment": three}, site="local-slurm", orchestrator=_served_opd(model))
    with pytest.raises(ConfigError, match=r"needs 5 nodes .*\+ 1 served teacher node\(s\).*at most 4"):
        make_cfg(
            {"run": {"name": "over"}, "deployment": {**three, "num_train_nodes": 3}},
            site="local-slurm",
            orchestrator=_served_opd(model),
        )
