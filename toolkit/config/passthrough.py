"""Reading the ``[inference.vllm]`` pass-through table: its keys may be spelled snake_case, kebab-case or as flags,
so every reader (rules, placement, engine commands) normalizes them here, one way."""

from __future__ import annotations

from typing import Any


def option_key(key: str) -> str:
    """A vLLM option name as one spelling: ``--Max-Model-Len``, ``max-model-len`` -> ``max_model_len``."""
    return str(key).strip().lstrip("-").replace("-", "_").lower()


def vllm_arg(vllm: dict[str, Any], name: str, default: Any = None) -> Any:
    """Read a pass-through vLLM argument given in snake_case or kebab-case (``tensor_parallel_size``)."""
    for key in (name, name.replace("_", "-")):
        if key in vllm:
            return vllm[key]
    return default


def vllm_max_model_len(vllm: dict) -> int | None:
    """``max_model_len`` of the pass-through table as a positive int, or None (unset, auto, or not a number)."""
    v = vllm_arg(vllm, "max_model_len")
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def whole_number(value: Any) -> int | None:
    """A pass-through value as a whole number: an int (not a bool) or a string of digits (a CLI override's text);
    None for anything else."""
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def vllm_tp(vllm: dict[str, Any]) -> int:
    """``tensor_parallel_size`` of the pass-through table: 1 when unset, or when it is not a whole number >= 1
    (the config check refuses that value, naming the key; the deployment rules run on the default meanwhile)."""
    v = whole_number(vllm_arg(vllm, "tensor_parallel_size", 1))
    return v if v is not None and v >= 1 else 1
