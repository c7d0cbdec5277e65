"""Unit tests of untie_embeddings on real tied checkpoints written by transformers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prereqs import need_module

torch = need_module("torch")
transformers = need_module("transformers")

from toolkit.models.tiny import build_tiny_model
from toolkit.models.untie import INDEX_FILE, is_tied, untie_embeddings


def _save_tied(out_dir: Path, *, max_shard_size: str | None = None) -> Path:
    """A small tied Llama checkpoint, saved the way transformers saves tied models (no lm_head tensor)."""
    config = transformers.LlamaConfig(
        vocab_size=96,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        head_dim=32,
        num_key_value_heads=1,
        intermediate_size=128,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(out_dir, **kwargs)
    return out_dir


def _logits(model_dir: Path) -> torch.Tensor:
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    with torch.no_grad():
        return model(torch.tensor([[1, 5, 9, 42, 7]])).logits


def _stored_keys(model_dir: Path) -> list[str]:
    from safetensors import safe_open

    keys = []
    for f in sorted(model_dir.glob("*.safetensors")):
        with safe_open(f, framework="pt") as h:
            keys.extend(h.keys())
    return keys


@pytest.mark.parametrize("max_shard_size", [None, "100KB"])
def test_untie_keeps_the_function_and_adds_an_independent_lm_head(tmp_path, max_shard_size):
    model_dir = _save_tied(tmp_path / "tied", max_shard_size=max_shard_size)
    assert (model_dir / INDEX_FILE).exists() == (max_shard_size is not None)
    before = _logits(model_dir)
    assert is_tied(model_dir)

    assert untie_embeddings(model_dir) is True

    assert not is_tied(model_dir)
    assert _stored_keys(model_dir).count("lm_head.weight") == 1
    if max_shard_size:
        index = json.loads((model_dir / INDEX_FILE).read_text())
        assert "lm_head.weight" in index["weight_map"]
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    assert model.lm_head.weight.data_ptr() != model.get_input_embeddings().weight.data_ptr()
    assert torch.equal(model.lm_head.weight, model.get_input_embeddings().weight)
    torch.testing.assert_close(_logits(model_dir), before, rtol=0, atol=0)
    # No temporary files left behind.
    assert not [p for p in model_dir.iterdir() if p.name.startswith(".")]


def test_untie_is_idempotent_and_leaves_untied_models_alone(tmp_path):
    model_dir = _save_tied(tmp_path / "tied")
    assert untie_embeddings(model_dir) is True
    mtimes = {p.name: p.stat().st_mtime_ns for p in model_dir.iterdir()}
    assert untie_embeddings(model_dir) is False
    assert {p.name: p.stat().st_mtime_ns for p in model_dir.iterdir()} == mtimes

    tiny = build_tiny_model(tmp_path / "tiny")
    assert untie_embeddings(tiny) is False


def test_untie_overwrites_a_stale_stored_lm_head(tmp_path):
    """A tied checkpoint that also stores a different lm_head: the embedding is what tied loaders used."""
    from safetensors.torch import load_file, save_file

    model_dir = _save_tied(tmp_path / "tied")
    before = _logits(model_dir)
    tensors = load_file(model_dir / "model.safetensors")
    tensors["lm_head.weight"] = torch.zeros_like(tensors["model.embed_tokens.weight"])
    save_file(tensors, model_dir / "model.safetensors", metadata={"format": "pt"})

    assert untie_embeddings(model_dir) is True
    torch.testing.assert_close(_logits(model_dir), before, rtol=0, atol=0)


def test_untie_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError):
        untie_embeddings(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "tie_word_embeddings": True}))
    with pytest.raises(FileNotFoundError, match="safetensors"):
        untie_embeddings(tmp_path)
