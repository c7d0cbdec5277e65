"""``srl rl --help``: every config field with its type, default and meaning, generated from the model."""

from __future__ import annotations

import typing
from typing import Any

from pydantic import BaseModel

from .model import RLConfig


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    out: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        out += _models_in(arg)
    return out


def _type_name(annotation: Any) -> str:
    text = getattr(annotation, "__name__", None) if isinstance(annotation, type) else None
    return text or str(annotation).replace("typing.", "").replace("pathlib.", "")


def schema_help(model: type[BaseModel] = RLConfig, prefix: str = "") -> str:
    """Text listing each field as ``path (type, default): description``; nested tables are expanded."""
    lines: list[str] = []
    if not prefix:
        lines.append("Config fields (TOML tables; override any with --section.field VALUE, kebab-case allowed):\n")
    for name, fld in model.model_fields.items():
        path = f"{prefix}{name}"
        subs = _models_in(fld.annotation)
        desc = (fld.description or "").replace("\n", " ")
        if subs:
            variants = [m.model_fields["type"].default for m in subs if "type" in m.model_fields]
            head = f"[{path}]" + (f"  type = {' | '.join(map(str, variants))}" if len(subs) > 1 else "")
            lines.append(head + (f"  {desc}" if desc else ""))
            for m in subs:
                sub = schema_help(m, prefix=f"{path}.")
                if len(subs) > 1:
                    lines.append(f"  (type = \"{m.model_fields['type'].default}\")")
                lines.append(sub)
            continue
        default = fld.default if fld.default is not None else "None"
        if fld.default_factory is not None:
            default = fld.default_factory()
        lines.append(f"  {path} ({_type_name(fld.annotation)}, default {default!r}): {desc}".rstrip(": "))
    return "\n".join(lines)
