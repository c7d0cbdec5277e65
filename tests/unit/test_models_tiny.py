"""Unit tests of the tiny local model: determinism, untied weights, char-level tokenizer, ChatML, shapes."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from prereqs import need_module

torch = need_module("torch")
transformers = need_module("transformers")

from toolkit.models.tiny import CHARACTERS, SPECIAL_TOKENS, build_tiny_model


def _hashes(model_dir: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(model_dir.iterdir())}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "m", seed=0)


@pytest.fixture(scope="module")
def tokenizer(tiny_dir):
    return transformers.AutoTokenizer.from_pretrained(tiny_dir)


def test_same_seed_gives_identical_files_and_other_seed_differs(tiny_dir, tmp_path):
    again = build_tiny_model(tmp_path / "again", seed=0)
    other = build_tiny_model(tmp_path / "other", seed=1)
    assert _hashes(again) == _hashes(tiny_dir)
    assert _hashes(other)["model.safetensors"] != _hashes(tiny_dir)["model.safetensors"]
    # Only the weights depend on the seed.
    assert {k: v for k, v in _hashes(other).items() if k != "model.safetensors"} == {
        k: v for k, v in _hashes(tiny_dir).items() if k != "model.safetensors"
    }


def test_build_leaves_caller_rng_untouched(tmp_path):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_tiny_model(tmp_path / "m", seed=5)
    assert torch.equal(torch.rand(3), expected)


def test_weights_are_untied_fp32_with_explicit_lm_head(tiny_dir):
    from safetensors import safe_open

    config = json.loads((tiny_dir / "config.json").read_text())
    assert config["tie_word_embeddings"] is False
    assert config["head_dim"] >= 32  # vLLM CPU attention needs head_dim in {32, 64, ...}
    assert config["head_dim"] * config["num_attention_heads"] == 128
    with safe_open(tiny_dir / "model.safetensors", framework="pt") as f:
        keys = set(f.keys())
        assert "lm_head.weight" in keys
        lm_head, embed = f.get_tensor("lm_head.weight"), f.get_tensor("model.embed_tokens.weight")
    assert lm_head.dtype == torch.float32
    assert lm_head.shape == embed.shape == (len(SPECIAL_TOKENS) + len(CHARACTERS), 128)
    assert not torch.equal(lm_head, embed)


def test_generation_config_does_not_truncate(tiny_dir):
    gen = json.loads((tiny_dir / "generation_config.json").read_text())
    assert gen["top_k"] == 0 and gen["top_p"] == 1.0 and gen["temperature"] == 1.0
    loaded = transformers.GenerationConfig.from_pretrained(tiny_dir)
    assert loaded.top_k == 0 and loaded.eos_token_id == 2


def test_tokenizer_is_one_token_per_character_and_round_trips_ascii(tokenizer):
    text = "".join(CHARACTERS) + "  The quick brown fox, isn't it? {x: [1, 2]}\n"
    ids = tokenizer(text)["input_ids"]
    assert len(ids) == len(text)  # no BOS, one token per character
    assert tokenizer.decode(ids) == text
    assert tokenizer.convert_ids_to_tokens(ids[:3]) == list(text[:3])


def test_tokenizer_specials(tokenizer):
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == 2
    assert tokenizer.pad_token_id == 0 and tokenizer.padding_side == "left"
    assert len(tokenizer) == len(SPECIAL_TOKENS) + len(CHARACTERS)
    assert tokenizer("<|im_start|>hi<|im_end|>")["input_ids"] == [1, *tokenizer("hi")["input_ids"], 2]
    # Non-ASCII maps to the unknown token instead of failing.
    assert tokenizer("é")["input_ids"] == [tokenizer.unk_token_id]


def test_chat_template_renders_chatml(tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Reverse: abc"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nReverse: abc<|im_end|>\n<|im_start|>assistant\n"
    )
    no_prompt = tokenizer.apply_chat_template(messages[1:], tokenize=False)
    assert no_prompt == "<|im_start|>user\nReverse: abc<|im_end|>\n"


def test_tokenizer_config_is_portable(tiny_dir):
    config = json.loads((tiny_dir / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"  # a class transformers 4.x also knows
    assert "<|im_start|>" in config["chat_template"]


def test_loads_and_gives_logits_of_vocab_shape(tmp_path, tokenizer):
    model_dir = build_tiny_model(tmp_path / "m", seed=0)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    assert model.lm_head.weight.data_ptr() != model.get_input_embeddings().weight.data_ptr()
    batch = tokenizer(["ab", "abcde"], return_tensors="pt", padding=True)
    with torch.no_grad():
        logits = model(**batch).logits
    assert logits.shape == (2, 5, len(tokenizer))
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()
