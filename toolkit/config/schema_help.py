"""``srl rl --help``: every config field with its type, default and meaning, generated from the model."""

from __future__ import annotations

import itertools
import re
from typing import Any

from pydantic import BaseModel

from .model import RLConfig, models_in


def _attribute_docs() -> dict[tuple[str, str], str]:
    """``(class name, field) -> docstring`` of every config class, read from the source with ``ast``.

    Field docs are string literals under each field (the style of ``model.py``). They are read here, only for
    help, instead of by pydantic at import (``use_attribute_docstrings`` costs ~0.5 s on every CLI start).
    """
    import ast
    import inspect

    from . import model as model_module
    from . import site as site_module

    docs: dict[tuple[str, str], str] = {}
    for module in (model_module, site_module):
        tree = ast.parse(inspect.getsource(module))
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            body = cls.body
            for a, b in itertools.pairwise(body):
                if (
                    isinstance(a, ast.AnnAssign)
                    and isinstance(a.target, ast.Name)
                    and isinstance(b, ast.Expr)
                    and isinstance(b.value, ast.Constant)
                    and isinstance(b.value.value, str)
                ):
                    docs[(cls.name, a.target.id)] = " ".join(b.value.value.split())
    return docs


def _type_name(annotation: Any) -> str:
    text = getattr(annotation, "__name__", None) if isinstance(annotation, type) else None
    text = text or str(annotation).replace("typing.", "").replace("pathlib.", "")
    # Annotated[str, BeforeValidator(...)] (an env var's value) reads as its plain type; the validator is internal.
    return re.sub(r"Annotated\[(\w+), [^\[\]]*\]", r"\1", text)


def _default_text(fld: Any) -> str:
    """How a field's default reads in help: ``required``, ``none``, a path as text, strings quoted."""
    from pathlib import PurePath

    if fld.is_required():
        return "required"
    value = fld.default_factory() if fld.default_factory is not None else fld.default
    if value is None:
        return "none"
    if isinstance(value, PurePath):
        return repr(str(value))
    return repr(value) if isinstance(value, str) else str(value)


OWN_FLAGS_HELP = """srl rl @ run.toml [@ overlay.toml ...] [--section.field VALUE ...] [flags]

Flags: --dry-run (validate, plan and write the would-be files; nothing starts), --resume (continue the run named by
run.name, or the newest run of this config that trained), --clean (delete the named run first), --help.
"""


def schema_help(model: type[BaseModel] = RLConfig, prefix: str = "", docs: dict | None = None) -> str:
    """Text listing each field as ``path (type, default): description``; nested tables are expanded after the
    plain fields of their level, so every field sits under its own table heading."""
    docs = _attribute_docs() if docs is None else docs
    lines: list[str] = []
    if not prefix:
        lines.append(OWN_FLAGS_HELP)
        lines.append("Config fields (TOML tables; override any with --section.field VALUE, kebab-case allowed):\n")
    fields = sorted(model.model_fields.items(), key=lambda kv: bool(models_in(kv[1].annotation)))
    for name, fld in fields:
        path = f"{prefix}{name}"
        subs = models_in(fld.annotation)
        desc = (fld.description or docs.get((model.__name__, name), "")).replace("\n", " ")
        if subs:
            variants = [m.model_fields["type"].default for m in subs if "type" in m.model_fields]
            head = f"[{path}]" + (f"  type = {' | '.join(map(str, variants))}" if len(subs) > 1 else "")
            lines.append(head + (f"  {desc}" if desc else ""))
            for m in subs:
                sub = schema_help(m, prefix=f"{path}.", docs=docs)
                if len(subs) > 1:
                    lines.append(f'  (type = "{m.model_fields["type"].default}")')
                lines.append(sub)
            continue
        lines.append(f"  {path} ({_type_name(fld.annotation)}, default {_default_text(fld)}): {desc}".rstrip(": "))
    return "\n".join(lines)
