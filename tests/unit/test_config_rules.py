"""Every cross-field rule, each with its own test (field cases B13 config part, B14, B19, B20, B22, B29, B30)."""

from __future__ import annotations

import pytest
from config_cases import config as cfg
from config_cases import errors_of, validate, warnings_of

from toolkit.config import ConfigError
from toolkit.config.slurm_time import parse_slurm_time


def test_base_is_valid():
    assert validate(cfg()).config.orchestrator.batch_size == 64


def test_b20_batch_not_whole_groups_names_fields_and_nearest_sizes():
    text = errors_of(cfg(orchestrator={"batch_size": 100, "group_size": 8}))
    assert "orchestrator.batch_size" in text and "orchestrator.group_size" in text
    assert "96 or 104" in text


def test_b20_group_size_one_is_rejected_with_reason():
    text = errors_of(cfg(orchestrator={"batch_size": 64, "group_size": 1}))
    assert "group-relative advantage" in text and "group_size >= 2" in text


def test_b20_per_env_group_size_checked_too():
    env = {"taskset": {"id": "srl-reverse-text"}, "group_size": 12}
    text = errors_of(cfg(orchestrator={"train": {"env": [env]}}))
    assert "orchestrator.train.env[0].group_size" in text and "60 or 72" in text


def test_distillation_allows_a_group_of_one_and_is_per_env():
    teacher = {"name": "t", "base_url": "http://h:8001/v1"}
    opd = {"type": "opd", "teacher": teacher}
    # the run distils: a group only fans out sampling, so one rollout per task is fine (no small-group warning)
    solo = cfg(orchestrator={"group_size": 1, "train": {"algo": opd}})
    assert "fewer than 8" not in warnings_of(solo)  # validates, without the small-group warning
    # a GRPO env beside an OPD env that inherits group_size 1: the group-relative env is refused
    envs = [{"taskset": {"id": "srl-reverse-text"}, "algo": opd}, {"taskset": {"id": "srl-arith"}}]
    mixed = cfg(orchestrator={"group_size": 1, "train": {"env": envs}})
    assert "group-relative advantage (grpo) needs group_size >= 2" in errors_of(mixed)
    envs[1]["group_size"] = 8
    validate(cfg(orchestrator={"group_size": 1, "train": {"env": envs}}))
    # an eval env trains nothing
    ev = {"taskset": {"id": "srl-reverse-text", "split": "test"}, "algo": opd}
    text = errors_of(cfg(orchestrator={"eval": {"env": [ev], "interval": 5}}))
    assert "orchestrator.eval.env[0].algo" in text


def test_small_group_warns():
    assert "fewer than 8 rollouts per task" in warnings_of(cfg(orchestrator={"group_size": 4}))


def test_env_names_unique():
    envs = [{"taskset": {"id": "srl-arith"}}, {"taskset": {"id": "srl-arith"}}]
    assert "used 2 times" in errors_of(cfg(orchestrator={"train": {"env": envs}}))
    envs = [{"name": "a", "taskset": {"id": "srl-arith"}}, {"name": "b", "taskset": {"id": "srl-arith"}}]
    validate(cfg(orchestrator={"train": {"env": envs}}))


def test_ratio_on_all_or_none():
    envs = [{"name": "a", "ratio": 2, "taskset": {"id": "srl-arith"}}, {"name": "b", "taskset": {"id": "srl-arith"}}]
    text = errors_of(cfg(orchestrator={"train": {"env": envs}}))
    assert "ratio" in text and "['b']" in text


def test_max_concurrent_covers_group_times_workers():
    env = {"taskset": {"id": "srl-arith"}, "pool": {"max_workers": 16}}
    text = errors_of(cfg(orchestrator={"max_concurrent": 64, "train": {"env": [env]}}))
    assert "max_concurrent" in text and ">= 128" in text


def test_b19_max_steps_must_exceed_async_level():
    text = errors_of(cfg(max_steps=2, orchestrator={"max_async_level": 4}))
    assert "max_steps" in text and "max_async_level" in text


def test_infinite_timeout_rejected():
    env = {"taskset": {"id": "srl-arith"}, "timeout": {"rollout": float("inf")}}
    assert "timeout.rollout" in errors_of(cfg(orchestrator={"train": {"env": [env]}}))


def test_truncated_sampling_needs_bounded_top_k():
    assert "top_k" in errors_of(cfg(orchestrator={"train": {"sampling": {"top_p": 0.9}}}))
    validate(cfg(orchestrator={"train": {"sampling": {"top_p": 0.9, "top_k": 50}}}))


def test_single_node_gpu_arithmetic():
    dep = {"type": "single_node", "gpus_per_node": 8, "num_train_gpus": 6, "num_infer_gpus": 4}
    assert "6 + 4 = 10" in errors_of(cfg(deployment=dep))


MULTI = {"type": "multi_node", "gpus_per_node": 8, "num_train_nodes": 2, "num_infer_nodes": 1}


def test_multi_node_needs_slurm_site():
    assert "Slurm site" in errors_of(cfg(deployment=MULTI))


def _slurm_cfg(**patch):
    return cfg({"deployment": MULTI, "site": "local-slurm"}, patch)


def _validate_with_sites(data, tmp_path, monkeypatch):
    for s in ("local", "local-slurm"):
        (tmp_path / f"{s}.toml").write_text("")
    monkeypatch.setenv("SRL_SITE_CONFIGS", str(tmp_path))
    return validate(data)


def _errors_with_sites(data, tmp_path, monkeypatch):
    with pytest.raises(ConfigError) as e:
        _validate_with_sites(data, tmp_path, monkeypatch)
    return str(e.value)


def test_b30_disaggregated_nodes_from_nodes_per_replica(tmp_path, monkeypatch):
    from toolkit.placement.topology import derive_topology

    infer = {
        "deployment": {
            "type": "disaggregated",
            "num_prefill_replicas": 1,
            "prefill_nodes_per_replica": 1,
            "num_decode_replicas": 1,
            "decode_nodes_per_replica": 2,
        }
    }
    data = _slurm_cfg(inference=infer, deployment={"num_infer_nodes": 3, "num_train_nodes": 2})
    topo = derive_topology(_validate_with_sites(data, tmp_path, monkeypatch).config)
    assert topo.num_nodes == 5
    isl = topo.islands[0]
    assert isl.prefill_nodes == ((0,),) and isl.decode_nodes == ((1, 2),) and topo.trainer_nodes == (3, 4)
    # Worker counts (2) instead of nodes (3) is caught, and an explicit total that disagrees is an error.
    text = _errors_with_sites(_slurm_cfg(inference=infer, deployment={"num_infer_nodes": 2}), tmp_path, monkeypatch)
    assert "implies" in text and "= 3" in text
    data = _slurm_cfg(inference=infer, deployment={"num_infer_nodes": 3, "num_train_nodes": 2, "nodes": 4})
    assert "needs 5 nodes" in _errors_with_sites(data, tmp_path, monkeypatch)


def test_b29_trainer_dp_accounts_for_tp_cp(tmp_path, monkeypatch):
    from toolkit.placement.topology import derive_topology

    data = _slurm_cfg(trainer={"tp": 2, "cp": 1})
    topo = derive_topology(_validate_with_sites(data, tmp_path, monkeypatch).config)
    assert topo.trainer_dp == 8
    text = _errors_with_sites(_slurm_cfg(trainer={"tp": 3}), tmp_path, monkeypatch)
    assert "does not divide" in text and "16" in text


def test_tp_divides_gpus_per_node(tmp_path, monkeypatch):
    text = _errors_with_sites(_slurm_cfg(inference={"vllm": {"tensor_parallel_size": 3}}), tmp_path, monkeypatch)
    assert "tensor_parallel_size" in text


def test_fsdp_group_divides_trainer_nodes(tmp_path, monkeypatch):
    text = _errors_with_sites(_slurm_cfg(deployment={"nodes_per_fsdp_group": 3}), tmp_path, monkeypatch)
    assert "nodes_per_fsdp_group" in text


def test_b18_broadcast_retention_covers_async_window():
    text = errors_of(cfg(orchestrator={"max_async_level": 8}, weight_broadcast={"keep": 2}, max_steps=20))
    assert "weight_broadcast.keep" in text and ">= max_async_level + 1 = 9" in text


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("90", 5400),
        ("30:00", 1800),
        ("04:00:00", 14400),
        ("2-12", 216000),
        ("3-0:00", 259200),
        ("1-02:03:04", 93784),
        ("UNLIMITED", None),
    ],
)
def test_slurm_time_forms(text, seconds):
    assert parse_slurm_time(text) == seconds


@pytest.mark.parametrize("bad", ["", "1:2:3:4", "abc", "0", "10:75", "1-2-3"])
def test_slurm_time_rejects(bad):
    with pytest.raises(ValueError):
        parse_slurm_time(bad)


def test_b13_signal_lead_below_time_limit():
    assert "signal_lead_s" in errors_of(cfg(slurm={"time": "10", "signal_lead_s": 600}))
    assert "slurm.time" in errors_of(cfg(slurm={"time": "4 hours"}))
    validate(cfg(slurm={"time": "04:00:00", "requeue": True, "signal": "USR2", "signal_lead_s": 600}))


def test_b14_default_signal_not_usr1_and_usr1_with_nccl_warns():
    assert validate(cfg()).config.slurm.signal == "USR2"
    gpu = {"type": "single_node", "gpus_per_node": 8, "num_train_gpus": 4, "num_infer_gpus": 4}
    infer = {"deployment": {"num_replicas": 4}}  # the 4 inference GPUs used by 4 engines (no idle GPU)
    assert "NCCL" in warnings_of(cfg(slurm={"signal": "USR1"}, deployment=gpu, inference=infer))


def test_b02_per_task_gpu_binding_rejected():
    text = errors_of(cfg(slurm={"extra_directives": ["--gpus-per-task=1"]}))
    assert "P2P" in text or "local ranks" in text


def test_b22_secret_values_in_env_tables_rejected():
    text = errors_of(cfg(env_vars={"WANDB_API_KEY": "dummy-secret-123"}))
    assert "env_vars.WANDB_API_KEY" in text and "dummy-secret-123" not in text


def test_b28_pkill_pre_run_command_warns():
    assert "pkill" in warnings_of(cfg(slurm={"pre_run_command": "pkill -9 -f vllm || true"}))


def test_unknown_key_did_you_mean():
    text = errors_of(cfg(orchestrator={"batch_sise": 3}))
    assert "unknown key 'batch_sise'" in text and "did you mean 'batch_size'" in text


def test_unknown_site_lists_allowed():
    text = errors_of(cfg(site="nowhere"))
    assert "unknown site 'nowhere'" in text and "local" in text


def test_bad_run_name_rejected():
    assert "run.name" in errors_of(cfg(run={"name": "../../etc"}))


def test_teacher_deployment_must_not_be_the_policys_own(tmp_path):
    dep = tmp_path / "serve"
    dep.mkdir()
    opd = {"type": "opd", "teacher": {"deployment": str(dep)}}
    text = errors_of(cfg(inference={"external": str(dep)}, orchestrator={"train": {"algo": opd}}))
    assert "orchestrator.train.algo.teacher.deployment" in text and "also inference.external" in text
    missing = {"type": "opd", "teacher": {"deployment": str(tmp_path / "nowhere")}}
    warned = warnings_of(cfg(orchestrator={"train": {"algo": missing}}))
    assert "orchestrator.train.algo.teacher.deployment" in warned and "srl inference" in warned


def test_a_served_teacher_not_here_is_a_warning_and_a_local_run_refuses_it(tmp_path):
    from toolkit.config import ConfigError
    from toolkit.launch.pipeline import check_local_model

    opd = {"type": "opd", "teacher": {"serve": True, "name": str(tmp_path / "sft" / "model")}}
    checked = validate(cfg(orchestrator={"train": {"algo": opd}}))  # a Slurm job may queue behind the SFT run
    text = "\n".join(str(w) for w in checked.warnings)
    assert "orchestrator.train.algo.teacher.name" in text and "no config.json" in text
    with pytest.raises(ConfigError, match=r"orchestrator.train.algo.teacher.name.*no config.json"):
        check_local_model(checked.config)  # a local run starts at once


def test_reference_top_k_must_fit_the_engines_max_logprobs():
    text = errors_of(
        cfg(inference={"vllm": {"max-logprobs": 5}}, orchestrator={"train": {"algo": {"type": "opsd", "top_k": 20}}})
    )
    assert "orchestrator.train.algo.top_k" in text and "inference.vllm.max_logprobs is 5" in text
    # an endpoint teacher's own limit is its server's business
    opd = {"type": "opd", "top_k": 20, "teacher": {"name": "t", "base_url": "http://h:1/v1"}}
    validate(cfg(inference={"vllm": {"max_logprobs": 5}}, orchestrator={"train": {"algo": opd}}))


def test_a_run_algo_that_no_env_uses_is_a_warning():
    env = {"taskset": {"id": "srl-reverse-text"}, "algo": {"type": "grpo"}}
    opd = {"type": "opd", "teacher": {"name": "t", "base_url": "http://h:1/v1"}}
    warned = warnings_of(cfg(orchestrator={"train": {"algo": opd, "env": [env]}}))
    assert "orchestrator.train.algo" in warned and "applies to no env" in warned
