"""Unit tests of LoRA training's adapter broadcast: PEFT-format save/load round trip, the merged path's correctness,
and the engine arguments a LoRA run adds. The engine side is tested for real in tests/integration/test_lora_rl.py."""

from __future__ import annotations

import json

import pytest
from lora_checks import load_adapter
from prereqs import need_module

torch = need_module("torch")
need_module("transformers")
need_module("peft")

from safetensors.torch import load_file

from toolkit.engines.commands import LORA_ENGINE_ENV, CommandError, lora_engine_args
from toolkit.inference.weights import is_lora_adapter
from toolkit.models.tiny import build_tiny_model
from toolkit.run.layout import STABLE_MARKER, RunDir
from toolkit.trainer.broadcast import write_adapter_broadcast
from toolkit.trainer.lora import (
    ADAPTER_CONFIG_FILE,
    ADAPTER_WEIGHTS_FILE,
    adapter_config,
    adapter_state_dict,
    apply_lora,
    merged_state_dict,
)
from toolkit.trainer.model import load_policy

LORA = {"rank": 4, "alpha": 8.0, "dropout": 0.0, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "m", seed=0)


def _trained(tiny_dir, seed: int):
    """A LoRA-wrapped tiny model whose B matrices are non-zero (as after training), deterministic per seed."""
    torch.manual_seed(seed)
    model = apply_lora(load_policy(tiny_dir), LORA)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    return model


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_only_adapter_weights_train_and_fresh_adapter_is_the_base_model(tiny_dir):
    base = load_policy(tiny_dir)
    model = apply_lora(load_policy(tiny_dir), LORA)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    ids = torch.tensor([[1, 5, 9, 13, 17]])
    assert torch.equal(_logits(model, ids), _logits(base, ids))  # B = 0: policy version 0 is the base model


def test_adapter_broadcast_round_trip(tiny_dir, tmp_path):
    run = RunDir(tmp_path / "run")
    src = _trained(tiny_dir, seed=1)
    tensors = adapter_state_dict(src)
    # PEFT's names: what vLLM's /v1/load_lora_adapter reads; shapes (rank, in) and (out, rank).
    assert all(k.startswith("base_model.model.") and (".lora_A." in k or ".lora_B." in k) for k in tensors)
    a = next(v for k, v in tensors.items() if ".q_proj.lora_A." in k)
    assert a.shape[0] == LORA["rank"]
    out = write_adapter_broadcast(run, 3, tensors, adapter_config(src, tiny_dir))
    assert out == run.broadcast_step(3) and (out / STABLE_MARKER).is_file()
    assert sorted(p.name for p in out.iterdir()) == sorted([ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE, STABLE_MARKER])
    assert is_lora_adapter(out)
    cfg = json.loads((out / ADAPTER_CONFIG_FILE).read_text())
    assert (
        cfg["r"] == 4 and cfg["lora_alpha"] == 8.0 and sorted(cfg["target_modules"]) == sorted(LORA["target_modules"])
    )
    assert cfg["peft_type"] == "LORA" and cfg["base_model_name_or_path"] == str(tiny_dir)
    on_disk = load_file(str(out / ADAPTER_WEIGHTS_FILE))
    assert set(on_disk) == set(tensors) and all(torch.equal(on_disk[k], tensors[k]) for k in tensors)

    dst = _trained(tiny_dir, seed=2)  # different adapter weights before loading
    ids = torch.tensor([[2, 4, 6, 8, 10, 12]])
    assert not torch.allclose(_logits(dst, ids), _logits(src, ids))
    load_adapter(dst, out)
    assert torch.equal(_logits(dst, ids), _logits(src, ids))


def test_load_adapter_refuses_a_different_rank(tiny_dir, tmp_path):
    run = RunDir(tmp_path / "run")
    src = _trained(tiny_dir, seed=1)
    out = write_adapter_broadcast(run, 1, adapter_state_dict(src), adapter_config(src))
    other = apply_lora(load_policy(tiny_dir), {**LORA, "rank": 8})
    with pytest.raises(ValueError, match="shape"):
        load_adapter(other, out)
    with pytest.raises(FileNotFoundError):
        load_adapter(other, tmp_path)


def test_merged_weights_equal_the_peft_model(tiny_dir):
    model = _trained(tiny_dir, seed=3)
    merged = load_policy(tiny_dir)
    merged.load_state_dict(merged_state_dict(model))
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    lp_peft = torch.log_softmax(_logits(model, ids), -1)
    lp_merged = torch.log_softmax(_logits(merged, ids), -1)
    assert (lp_peft - lp_merged).abs().max() < 1e-4
    # Training continues on unmerged weights: the adapter is still separate after the merge.
    assert any("lora_B" in n for n, _ in model.named_parameters())


def test_lora_engine_args_round_rank_up_to_vllm_values():
    assert lora_engine_args(4) == {"enable_lora": True, "max_lora_rank": 8, "max_loras": 1}
    assert lora_engine_args(16)["max_lora_rank"] == 16
    assert lora_engine_args(17)["max_lora_rank"] == 32
    with pytest.raises(CommandError, match="512"):
        lora_engine_args(1000)
    assert LORA_ENGINE_ENV == {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}


def test_stage_adapter_keeps_one_served_path_with_the_newest_adapter(tiny_dir, tmp_path):
    from toolkit.inference.weights import LORA_SERVED_DIR, stage_adapter

    run = RunDir(tmp_path / "run")
    first, second = _trained(tiny_dir, seed=1), _trained(tiny_dir, seed=2)
    d1 = write_adapter_broadcast(run, 1, adapter_state_dict(first), adapter_config(first))
    d2 = write_adapter_broadcast(run, 2, adapter_state_dict(second), adapter_config(second))
    served = stage_adapter(d1)
    assert served == run.broadcasts.absolute() / LORA_SERVED_DIR
    assert (served / ADAPTER_WEIGHTS_FILE).read_bytes() == (d1 / ADAPTER_WEIGHTS_FILE).read_bytes()
    assert stage_adapter(d2) == served  # the same path for every version: engines re-read it, never an old one
    assert (served / ADAPTER_WEIGHTS_FILE).read_bytes() == (d2 / ADAPTER_WEIGHTS_FILE).read_bytes()
    assert sorted(p.name for p in served.iterdir()) == [ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE]
    from toolkit.run.layout import numbered_steps

    assert numbered_steps(run.broadcasts) == [1, 2]  # not taken for a broadcast step
