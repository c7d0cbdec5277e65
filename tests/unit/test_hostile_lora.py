"""Hostile LoRA configs: every LoRA setting the engines or the trainer cannot honour is refused at validation, naming
the field and the allowed values, before anything is written or submitted (nothing may fail only at run time).

Attacks: a rank above vLLM's largest ``--max-lora-rank``; an ``[inference.vllm]`` table that switches LoRA off or
caps the engines' rank below the trainer's; target modules the model lacks (or none); an external inference
deployment started without LoRA; a multi-rank CPU trainer whose data-parallel size the plan misreports.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from config_cases import config, errors_of, validate

ROOT = Path(__file__).resolve().parents[2]
LORA = {"rank": 8, "alpha": 16.0, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}


def cfg(*patches, **fields):
    """The base config with the LoRA table, then ``patches`` and ``fields``."""
    return config({"trainer": {"model": {"lora": LORA}}}, *patches, **fields)


def test_lora_base_is_valid():
    assert validate(cfg()).config.trainer.model.lora.rank == 8


@pytest.mark.parametrize("rank", [513, 600, 1024])
def test_rank_above_vllm_max_names_the_field_and_bound(rank):
    text = errors_of(cfg(trainer={"model": {"lora": {"rank": rank}}}))
    assert "trainer.model.lora.rank" in text and "512" in text
    assert "site ports" not in text  # not misattributed to the port allocator


@pytest.mark.parametrize(
    ("vllm", "field"),
    [
        ({"max_lora_rank": 8}, "inference.vllm.max_lora_rank"),  # trainer rank 16 > engines' 8
        ({"max-lora-rank": 12}, "inference.vllm.max-lora-rank"),  # not one of vLLM's ranks
        ({"enable_lora": False}, "inference.vllm.enable_lora"),
        ({"enable-lora": False}, "inference.vllm.enable-lora"),
        ({"max_loras": 0}, "inference.vllm.max_loras"),
    ],
)
def test_engine_table_cannot_undo_lora(vllm, field):
    text = errors_of(cfg(trainer={"model": {"lora": {"rank": 16}}}, inference={"vllm": vllm}))
    assert field in text, text


def test_engine_rank_above_trainer_rank_is_fine():
    loaded = validate(cfg(inference={"vllm": {"max_lora_rank": 64}}))
    assert loaded.config.inference.vllm["max_lora_rank"] == 64


@pytest.mark.parametrize("targets", [[], ["nonexistent_proj"], ["q_proj", "qkv_proj"], ["all-linear"], [""]])
def test_target_modules_the_model_lacks_are_refused_with_allowed_values(targets):
    text = errors_of(cfg(trainer={"model": {"lora": {"target_modules": targets}}}))
    assert "trainer.model.lora.target_modules" in text
    assert "gate_proj" in text  # the allowed values are listed


def test_target_modules_of_the_model_family_pass():
    mods = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    assert validate(cfg(trainer={"model": {"lora": {"target_modules": mods}}})).config
    # peft matches a dotted suffix too
    assert validate(cfg(trainer={"model": {"lora": {"target_modules": ["self_attn.q_proj"]}}})).config


def test_target_modules_checked_against_a_model_directory(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    assert validate(cfg(model={"name": str(model)})).config
    text = errors_of(cfg(model={"name": str(model)}, trainer={"model": {"lora": {"target_modules": ["c_attn"]}}}))
    assert "trainer.model.lora.target_modules" in text and "c_attn" in text


def test_lora_with_external_inference_without_lora_is_refused(tmp_path):
    """An RL run with LoRA against a separately served deployment whose engines were started without LoRA would
    fail at the first policy update (load_lora_adapter refused): refuse it up front."""
    from toolkit.placement.plan import build_plan, write_plan
    from toolkit.preflight.site import load_site
    from toolkit.run.layout import RunDir

    serve = validate(cfg(trainer={"model": {"lora": None}}), purpose="serve").config
    ext = RunDir(tmp_path / "served")
    write_plan(ext, build_plan(serve, load_site("local"), ext, roles=("inference", "router")))
    text = errors_of(cfg(inference={"external": str(ext.root)}))
    assert "inference.external" in text and "enable-lora" in text

    lora_serve = validate(cfg(trainer={"model": {"lora": {"rank": 8}}}), purpose="serve").config
    write_plan(ext, build_plan(lora_serve, load_site("local"), ext, roles=("inference", "router")))
    assert validate(cfg(inference={"external": str(ext.root)})).config
    text = errors_of(cfg(inference={"external": str(ext.root)}, trainer={"model": {"lora": {"rank": 16}}}))
    assert "inference.external" in text and "max-lora-rank" in text


def test_cpu_train_ranks_reach_the_plans_data_parallel_size(tmp_path):
    """deployment.cpu_train_ranks = 2 runs two FSDP ranks under torchrun; the plan (SRL_TRAINER_DP, the sbatch
    header) must say 2, not 1."""
    from toolkit.placement.plan import build_plan
    from toolkit.preflight.site import load_site
    from toolkit.run.layout import RunDir

    c = validate(cfg(deployment={"cpu_train_ranks": 2})).config
    plan = build_plan(c, load_site("local"), RunDir(tmp_path / "r"))
    t = plan.process("trainer")
    assert t.nprocs_per_node == 2 and "--nproc-per-node" in t.command
    assert plan.trainer_dp == 2 and t.env["SRL_TRAINER_DP"] == "2"
    assert plan.process("orchestrator").env["SRL_TRAINER_DP"] == "2"


def test_lora_dropout_is_refused():
    """The trainer's forward runs in train mode, so LoRA dropout would make its logprobs differ from the engines'
    (which never drop out): every importance ratio and IPO mask would compare two different policies."""
    text = errors_of(cfg(trainer={"model": {"lora": {"dropout": 0.1}}}))
    assert "trainer.model.lora.dropout" in text and "0.0" in text


def test_every_model_alias_has_a_known_family():
    """A new alias without an entry would skip the target-module check with only a warning."""
    from toolkit.models.resolve import MODEL_ALIASES, local_model_dir
    from toolkit.preflight.lora import ALIAS_MODEL_TYPES, LORA_TARGETS

    assert set(ALIAS_MODEL_TYPES) == set(MODEL_ALIASES)
    assert set(ALIAS_MODEL_TYPES.values()) <= set(LORA_TARGETS)
    for alias, kind in ALIAS_MODEL_TYPES.items():
        built = local_model_dir(alias)
        if built is not None and (built / "config.json").is_file():  # built already: its config agrees
            assert json.loads((built / "config.json").read_text())["model_type"] == kind
