"""Optional LoRA training through peft, and merging adapters for the weight broadcast."""

from __future__ import annotations

import torch


def apply_lora(model: torch.nn.Module, lora: dict) -> torch.nn.Module:
    """Wrap ``model`` with peft LoRA adapters (``rank``, ``alpha``, ``dropout``, ``target_modules``).

    Only adapter weights stay trainable. Raises ImportError naming the ``train`` extra if peft is missing.
    """
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as e:
        raise ImportError("trainer.model.lora needs peft: pip install 'srl[train]'") from e
    cfg = LoraConfig(
        r=int(lora["rank"]), lora_alpha=float(lora["alpha"]), lora_dropout=float(lora["dropout"]),
        target_modules=list(lora["target_modules"]), bias="none", task_type="CAUSAL_LM",
    )
    return get_peft_model(model, cfg)


def merged_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Base-model weights with the adapters merged in (``W + scale * B @ A``), under the base model's HF names.

    Merges in place, copies, and unmerges, so training continues on the unmerged weights. Single-process only.
    """
    model.merge_adapter()
    try:
        out = {}
        for name, t in model.get_base_model().state_dict().items():
            if "lora_" in name:
                continue
            out[name.replace(".base_layer.", ".")] = t.detach().to("cpu").clone()
        return out
    finally:
        model.unmerge_adapter()
