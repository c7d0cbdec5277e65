"""Hostile run-config values that used to pass validation and then failed later, or did the wrong thing silently.

- Values that become ``#SBATCH`` options (partition, qos, account, job name, constraint, node lists, extra
  directives, the log path under ``output_dir``, the hetjob partition): whitespace, quotes, backslashes or newlines
  were caught only while rendering, as a ``RenderError`` traceback after the run directory was written. Now a
  config error names the field, and ``srl rl`` writes nothing.
- Secrets passed as vLLM arguments (``[inference.vllm] api_key``/``hf_token``) or taskset/env arguments were
  written verbatim into the resolved configs, placement.json and the engine's command line. Now refused like a
  secret in an env table, without echoing the value.
- ``monitors.wandb.api_key_var`` must be an environment variable name (a key pasted there is a secret in a file).
- References: a ``resume.dir`` without checkpoints (the fork silently started at step 0), a missing template
  file, a malformed env-server address or renderer import path, a missing external deployment (a warning).
- Numbers: inf/NaN in any float field, seeds outside what torch/numpy/vLLM take, unbounded grace periods, an IcePop
  band that masks on-policy tokens; ``[inference.vllm]`` keys that are not option names, multi-line values,
  data-parallel options the plan owns, a logprobs mode other than the sampling distribution's.
- Single-node GPU layouts whose engines and trainer share GPUs, or whose trainer gets no GPU on a GPU node, were
  placed silently. Now refused, naming the counts.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from config_cases import config as cfg
from config_cases import errors_of, validate

from toolkit.config import ConfigError

ROOT = Path(__file__).resolve().parents[2]
SLURM = {
    "site": "local-slurm",
    "deployment": {"type": "multi_node", "gpus_per_node": 0, "num_train_nodes": 1, "num_infer_nodes": 1},
}
CANARY = "sk-canary-0b5e1d7f3a"


BAD_WORDS = ["gpu x", "gpu\ntouch /tmp/PWNED", "a'b", 'a"b', "a\\b", "a`id`", "\t"]


@pytest.mark.parametrize("bad", BAD_WORDS)
@pytest.mark.parametrize("field", ["partition", "qos", "job_name", "constraint", "nodelist", "exclude"])
def test_sbatch_values_are_config_errors_naming_the_field(field, bad):
    text = errors_of(cfg(SLURM, {"slurm": {field: bad}}))
    assert f"slurm.{field}" in text and "#SBATCH" in text


def test_sbatch_extra_directive_with_space_is_a_config_error():
    text = errors_of(cfg(SLURM, {"slurm": {"extra_directives": ["--mail-type=END --mail-user=x"]}}))
    assert "slurm.extra_directives" in text and "#SBATCH" in text


def test_hetjob_partition_is_checked():
    dep = {"deployment": {"orchestrator_partition": "cpu nodes"}}
    text = errors_of(cfg(SLURM, dep))
    assert "deployment.orchestrator_partition" in text and "#SBATCH" in text


@pytest.mark.parametrize("out", ["/tmp/with space/runs", "/tmp/quo'te", "/tmp/new\nline"])
def test_output_dir_that_cannot_hold_slurm_logs_is_a_config_error(out):
    text = errors_of(cfg(SLURM, {"output_dir": out}))
    assert "output_dir" in text and "#SBATCH" in text
    # a local site never writes #SBATCH lines: the same directory is fine there
    assert validate(cfg({"output_dir": out})).config


def test_output_dir_with_a_slurm_filename_pattern_is_a_config_error():
    # sbatch expands %j, %x, %u... anywhere in --output: the job's logs would go to another directory.
    text = errors_of(cfg(SLURM, {"output_dir": "/scratch/%u/runs"}))
    assert "output_dir" in text and "'%'" in text
    assert validate(cfg({"output_dir": "/tmp/100%/runs"})).config  # no #SBATCH lines on a local site


def test_cli_refuses_before_writing_and_without_traceback(tmp_path, capsys):
    from toolkit.cli import main

    out = tmp_path / "out"
    rc = main(
        [
            "rl",
            "@",
            str(ROOT / "jobs/reverse-text/rl.toml"),
            "@",
            str(ROOT / "jobs/reverse-text/slurm.toml"),
            "--output-dir",
            str(out),
            "--dry-run",
            "--slurm.partition",
            "gpu\ntouch /tmp/PWNED",
        ]
    )
    err = capsys.readouterr().err
    assert rc != 0 and "slurm.partition" in err and "Traceback" not in err
    assert not out.exists()


@pytest.mark.parametrize(
    "patch",
    [
        {"inference": {"vllm": {"api_key": CANARY}}},
        {"inference": {"vllm": {"hf-token": CANARY}}},
        {"orchestrator": {"train": {"env": [{"taskset": {"id": "srl-reverse-text", "api_key": CANARY}}]}}},
        {
            "orchestrator": {
                "eval": {"env": [{"taskset": {"id": "srl-reverse-text", "split": "test", "OPENAI_API_KEY": CANARY}}]}
            }
        },
    ],
)
def test_secret_arguments_are_refused_without_echo(patch):
    text = errors_of(cfg(patch))
    assert "secret" in text and CANARY not in text


def test_secret_vllm_argument_never_reaches_a_file(tmp_path, capsys):
    from toolkit.cli import main

    out = tmp_path / "out"
    rc = main(
        [
            "rl",
            "@",
            str(ROOT / "jobs/reverse-text/rl.toml"),
            "--output-dir",
            str(out),
            "--dry-run",
            "--inference.vllm.api-key",
            CANARY,
        ]
    )
    err = capsys.readouterr().err
    assert rc != 0 and "inference.vllm.api_key" in err and CANARY not in err
    assert not out.exists()


@pytest.mark.parametrize("bad", ["sk-abc123", "WANDB KEY", "1KEY", ""])
def test_wandb_api_key_var_must_be_a_variable_name(bad):
    text = errors_of(cfg({"monitors": {"wandb": {"project": "p", "api_key_var": bad}}}))
    assert "monitors.wandb.api_key_var" in text


@pytest.mark.parametrize(
    ("dep", "words"),
    [
        # the trainer would get no GPU on a GPU node (it would run on CPU, or on GPUs the engines use)
        ({"gpus_per_node": 4, "num_infer_gpus": 4, "num_train_gpus": 0}, ["deployment.num_train_gpus"]),
        # no inference GPU: the engine is placed on GPU 0, the trainer's
        ({"gpus_per_node": 4, "num_infer_gpus": 0, "num_train_gpus": 2}, ["deployment.num_infer_gpus"]),
        # two engines of tp 1 need 2 GPUs but only 1 is given: the second lands on the trainer's GPU
        ({"gpus_per_node": 4, "num_infer_gpus": 1, "num_train_gpus": 1}, ["deployment.num_infer_gpus", "2"]),
        # 4 inference GPUs for one engine of tp 1: three GPUs silently idle
        ({"gpus_per_node": 8, "num_infer_gpus": 4, "num_train_gpus": 4}, ["deployment.num_infer_gpus", "1"]),
    ],
)
def test_single_node_gpu_split_must_match_the_engines(dep, words):
    replicas = 2 if dep["num_infer_gpus"] == 1 else 1
    text = errors_of(cfg({"deployment": dep, "inference": {"deployment": {"num_replicas": replicas}}}))
    for w in words:
        assert w in text, text


@pytest.mark.parametrize(
    ("patch", "field", "allowed"),
    [
        ({"inference": {"router": {"policy": "fastest"}}}, "inference.router.policy", "sticky_least_loaded"),
        (
            {"inference": {"deployment": {"type": "disaggregated", "kv_connector": "example"}}},
            "inference.deployment.disaggregated.kv_connector",
            "ExampleConnector",
        ),
    ],
)
def test_router_policy_and_kv_connector_outside_their_choices_name_the_field_and_the_choices(patch, field, allowed):
    text = errors_of(cfg(patch))
    assert field in text and allowed in text


def test_single_node_gpu_split_that_fits_is_valid():
    dep = {"gpus_per_node": 4, "num_infer_gpus": 2, "num_train_gpus": 2}
    assert validate(cfg({"deployment": dep, "inference": {"deployment": {"num_replicas": 2}}})).config
    pd = {"type": "disaggregated", "num_prefill_replicas": 1, "num_decode_replicas": 1}
    assert validate(cfg({"deployment": dep, "inference": {"deployment": pd}})).config
    tp2 = {"deployment": dep, "inference": {"vllm": {"tensor_parallel_size": 2}}}
    assert validate(cfg(tp2)).config


# ---- numbers: non-finite floats, seeds and durations the programs cannot take ----------------------------------
@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"trainer": {"model": {"lora": {"alpha": float("inf")}}}}, "trainer.model.lora.alpha"),
        (
            {"orchestrator": {"buffer": {"easy_threshold": float("nan")}}},
            "orchestrator.buffer.easy_threshold",
        ),
        (
            {"orchestrator": {"train": {"env": [{"taskset": {"id": "srl-reverse-text"}, "ratio": float("inf")}]}}},
            "orchestrator.train.env[0].ratio",
        ),
        ({"monitors": {"stop": {"max_mismatch_kl": float("inf")}}}, "monitors.stop.max_mismatch_kl"),
        ({"trainer": {"loss": {"adv_tau": float("inf")}}}, "trainer.loss.ipo.adv_tau"),
        ({"seed": 2**70}, "seed"),
        ({"seed": -1}, "seed"),
        ({"orchestrator": {"train": {"sampling": {"seed": 2**64}}}}, "orchestrator.train.sampling.seed"),
        ({"slurm": {"checkpoint_grace_s": 2**70, "requeue": False}}, "slurm.checkpoint_grace_s"),
        ({"trainer": {"loss": {"type": "icepop", "ratio_low": 5.0, "ratio_high": 0.2}}}, "trainer.loss"),
        ({"trainer": {"loss": {"type": "icepop", "ratio_low": 1.5, "ratio_high": 5.0}}}, "trainer.loss"),
    ],
)
def test_numbers_the_programs_cannot_use_are_refused(patch, field):
    text = errors_of(cfg(patch))
    assert field in text, text


# ---- the vLLM pass-through table ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("vllm", "words"),
    [
        ({"max model len": 5}, ["inference.vllm", "option name"]),
        ({"a\nb": 1}, ["inference.vllm", "option name"]),
        ({"max_model_len": "512\n--enable-lora"}, ["inference.vllm.max_model_len", "newline"]),
        ({"data_parallel_size_local": 4}, ["inference.vllm.data_parallel_size_local", "plan"]),
        ({"data-parallel-rpc-port": 4000}, ["inference.vllm.data-parallel-rpc-port", "plan"]),
        ({"logprobs_mode": "raw_logprobs"}, ["inference.vllm.logprobs_mode", "processed_logprobs"]),
        ({"max-loras": "abc"}, ["inference.vllm.max-loras", "whole number >= 1"]),
        ({"max_num_seqs": 0}, ["inference.vllm.max_num_seqs", "whole number >= 1"]),
        ({"tensor_parallel_size": 1.5}, ["inference.vllm.tensor_parallel_size", "whole number"]),
        ({"tensor_parallel_size": "abc"}, ["inference.vllm.tensor_parallel_size", "whole number >= 1"]),
        ({"seed": True}, ["inference.vllm.seed", "whole number >= 0"]),
        ({"gpu_memory_utilization": 1.5}, ["inference.vllm.gpu_memory_utilization", "(0, 1]"]),
        ({"gpu-memory-utilization": "most"}, ["inference.vllm.gpu-memory-utilization", "(0, 1]"]),
    ],
)
def test_vllm_table_values_that_break_the_engine_or_the_plan(vllm, words):
    text = errors_of(cfg({"inference": {"vllm": vllm}}))
    for w in words:
        assert w in text, text


# ---- references to things that must exist or have a shape --------------------------------------------------
def test_resume_dir_without_checkpoints_is_refused_not_a_silent_fresh_start(tmp_path):
    for where in (tmp_path / "missing", tmp_path):
        text = errors_of(cfg({"resume": {"dir": str(where)}}))
        assert "resume.dir" in text and "step 0" in text
    (tmp_path / "checkpoints" / "step_5").mkdir(parents=True)
    assert validate(cfg({"resume": {"dir": str(tmp_path)}})).config


def test_missing_external_inference_dir_warns(tmp_path):
    loaded = validate(cfg({"inference": {"external": str(tmp_path / "nope")}}))
    assert "inference.external" in "\n".join(str(w) for w in loaded.warnings)


def test_template_path_must_be_a_file(tmp_path):
    text = errors_of(cfg(SLURM, {"slurm": {"template_path": str(tmp_path / "nope.j2")}}))
    assert "slurm.template_path" in text


@pytest.mark.parametrize("addr", ["not a host", "host", "host:0", "host:99999", ":80", "h:80\n"])
def test_env_server_address_must_be_host_port(addr):
    text = errors_of(
        cfg({"orchestrator": {"train": {"env": [{"taskset": {"id": "srl-reverse-text"}, "address": addr}]}}})
    )
    assert "address" in text and "host:port" in text


@pytest.mark.parametrize("path", ["$(touch x)", "module", "a b:C", "pkg.mod:"])
def test_renderer_import_path_must_be_module_colon_class(path):
    text = errors_of(cfg({"orchestrator": {"renderer": {"import_path": path}}}))
    assert "orchestrator.renderer.import_path" in text


def test_valid_references_pass():
    env = {"taskset": {"id": "srl-reverse-text"}, "address": "10.0.0.5:8123"}
    data = cfg({"orchestrator": {"train": {"env": [env]}, "renderer": {"import_path": "my_pkg.render:MyRenderer"}}})
    assert validate(data).config


def test_rollouts_longer_than_a_packed_row_warn():
    text = "\n".join(str(w) for w in validate(cfg({"trainer": {"seq_len": 256}})).warnings)
    assert "trainer.seq_len" in text and "max_total_tokens" in text
    fits = cfg({"trainer": {"seq_len": 512}, "inference": {"vllm": {"max_model_len": 512}}})
    assert "trainer.seq_len" not in "\n".join(str(w) for w in validate(fits).warnings)


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"trainer": {"tp": 2}}, "trainer.tp"),
        ({"trainer": {"cp": 2}}, "trainer.cp"),
        ({"deployment": {"nodes_per_fsdp_group": 1}}, "deployment.nodes_per_fsdp_group"),
    ],
)
def test_trainer_parallelism_srl_does_not_implement_is_not_silent(patch, field):
    slurm = copy.deepcopy(SLURM)
    slurm["deployment"].update(num_train_nodes=2, gpus_per_node=4)
    loaded = validate(cfg(slurm, patch))
    assert field in "\n".join(str(w) for w in loaded.warnings)


@pytest.mark.parametrize(
    "key", ["max_num_batched_tokens", "return-tokens-as-token-ids", "tokenizer_mode", "max_tokens"]
)
def test_argument_names_with_token_words_are_not_secrets(key):
    data = cfg(
        {"inference": {"vllm": {key: 1}}},
        {"orchestrator": {"train": {"env": [{"taskset": {"id": "srl-reverse-text", key: 1}}]}}},
    )
    text = "\n".join(str(i) for i in _issues(data))
    assert "secret" not in text


def _issues(data):
    try:
        return validate(data).warnings
    except ConfigError as e:
        return e.issues


def test_a_gpu_serving_deployment_needs_no_trainer_gpus():
    dep = {"gpus_per_node": 4, "num_infer_gpus": 4, "num_train_gpus": 0}
    data = cfg({"deployment": dep, "inference": {"deployment": {"num_replicas": 4}}})
    assert validate(data, purpose="serve").config
    assert "deployment.num_train_gpus" in errors_of(data)


def test_site_node_limit_is_enforced_before_placing():
    """local-slurm declares limits.max_nodes = 4; a 6-node layout was placed and rendered anyway (and a typo'd
    node count on a site without a limit still builds its whole plan, which is where the limit also saves time)."""
    big = copy.deepcopy(SLURM)
    big["deployment"].update(num_train_nodes=5)
    text = errors_of(cfg(big))
    assert "limits.max_nodes" in text and "6" in text and "4" in text


@pytest.mark.parametrize("vllm", [{"seed": 0}, {"max-loras": "4"}, {"max_num_seqs": 1}, {"gpu_memory_utilization": 1}])
def test_vllm_table_whole_numbers_and_fractions_that_are_fine(vllm):
    validate(cfg({"inference": {"vllm": vllm}}))  # raises ConfigError if refused
