"""LoRA training through peft: wrapping the policy, and the adapter in PEFT's on-disk format for the broadcast.

A LoRA run broadcasts only the adapter (``adapter_config.json`` + ``adapter_model.safetensors``, PEFT's own names
``base_model.model.<module>.lora_A.weight`` / ``lora_B.weight``), which vLLM loads in place under one served LoRA
name (``toolkit.inference.weights``). vLLM applies ``W x + (alpha / r) * B A x`` (Hu et al. 2021, eq. 3; peft's
``scaling``), the same function peft computes, so trainer and engine logprobs agree (measured on CPU: see
``tests/integration/test_lora_rl.py``). :func:`merged_state_dict` remains for checks and for engines without
LoRA support: the base weights with ``W + (alpha / r) * B @ A`` folded in.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

ADAPTER_CONFIG_FILE = "adapter_config.json"
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"


def apply_lora(model: torch.nn.Module, lora: dict) -> torch.nn.Module:
    """Wrap ``model`` with peft LoRA adapters (``rank``, ``alpha``, ``dropout``, ``target_modules``).

    Only adapter weights stay trainable; B starts at zero, so the wrapped model computes the base model's function
    (policy version 0 = the base model). Raises ImportError naming the ``train`` extra if peft is missing.
    """
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as e:
        raise ImportError("trainer.model.lora needs peft: pip install 'srl[train]'") from e
    cfg = LoraConfig(
        r=int(lora["rank"]),
        lora_alpha=float(lora["alpha"]),
        lora_dropout=float(lora["dropout"]),
        target_modules=list(lora["target_modules"]),
        bias="none",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, cfg)


def adapter_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapter weights under PEFT's saved names, as contiguous CPU tensors (no base weights).

    Shapes: ``lora_A`` is ``(rank, in_features)``, ``lora_B`` ``(out_features, rank)``. Under FSDP2 (sharded
    parameters are DTensors) every rank must call this, in step: each tensor is all-gathered (a collective), and
    every rank gets the whole adapter.
    """
    from peft import get_peft_model_state_dict

    return {k: _whole(v).to("cpu").contiguous() for k, v in get_peft_model_state_dict(model).items()}


def _whole(t: torch.Tensor) -> torch.Tensor:
    # An FSDP2 shard (DTensor) is gathered into the whole tensor: a collective, same order on every rank.
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach()


def adapter_config(model: torch.nn.Module, base_model_dir: str | Path | None = None) -> dict:
    """The adapter's ``adapter_config.json`` content (peft's ``LoraConfig.to_dict()``), JSON-ready.

    ``base_model_name_or_path`` is set to ``base_model_dir`` when given (vLLM does not need it; PEFT readers do).
    """
    cfg = model.peft_config["default"].to_dict()
    if base_model_dir is not None:
        cfg["base_model_name_or_path"] = str(base_model_dir)
    # Sets (target_modules) and enums are not JSON: round-trip through json with str() fallbacks.
    return json.loads(json.dumps(cfg, default=lambda o: sorted(o) if isinstance(o, (set, frozenset)) else str(o)))


def merged_state_dict(model: torch.nn.Module, *, is_main: bool = True) -> dict[str, torch.Tensor] | None:
    """Base-model weights with the adapters folded in (``W + scaling * B @ A``, peft's ``scaling`` = alpha / r),
    under the base model's HF names, as contiguous CPU tensors; the model is not changed.

    Under FSDP2 (sharded parameters are DTensors) every rank must call this, in step: each tensor is all-gathered
    (a collective, same order on every rank); only the rank with ``is_main`` gets the dict, the others None.
    The product is taken in float32 and cast to the weight's dtype.
    """
    base = model.get_base_model()
    adapted = {
        name: mod
        for name, mod in base.named_modules()
        if hasattr(mod, "lora_A") and "default" in getattr(mod, "lora_A", {})
    }
    out: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, t in base.state_dict().items():
            if "lora_" in name:
                continue
            w = _whole(t)
            owner, _, leaf = name.rpartition(".base_layer.")
            if leaf == "weight" and owner in adapted:
                mod = adapted[owner]
                a, b = _whole(mod.lora_A["default"].weight), _whole(mod.lora_B["default"].weight)
                w = w + (b.float() @ a.float() * mod.scaling["default"]).to(w.dtype)
            if is_main:
                out[name.replace(".base_layer.", ".")] = w.to("cpu").contiguous().clone()
    return out if is_main else None
