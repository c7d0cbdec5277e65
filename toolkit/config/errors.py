"""Config errors that a researcher can act on: file, field path, what is allowed, and how to fix it."""

from __future__ import annotations

import difflib
import typing
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel


@dataclass
class ConfigIssue:
    """One problem: ``path`` is the dotted field path (``orchestrator.batch_size``), ``message`` says the fix."""

    path: str
    message: str
    source: str | None = None  # file the value came from, when known

    def __str__(self) -> str:
        where = f"{self.path}" if self.path else "(config)"
        src = f" [{self.source}]" if self.source else ""
        return f"{where}{src}: {self.message}"


class ConfigError(Exception):
    """Raised for any invalid config input. ``issues`` lists every problem found, not only the first."""

    def __init__(self, issues: list[ConfigIssue] | str, *, source: str | None = None):
        if isinstance(issues, str):
            issues = [ConfigIssue("", issues, source)]
        self.issues = issues
        super().__init__(self.render())

    def __str__(self) -> str:
        return self.render()

    def render(self) -> str:
        lines = [f"invalid config ({len(self.issues)} problem{'s' if len(self.issues) != 1 else ''}):"]
        lines += [f"  - {i}" for i in self.issues]
        return "\n".join(lines)


@dataclass
class Findings:
    """Accumulates errors and warnings from the cross-field rules."""

    errors: list[ConfigIssue] = field(default_factory=list)
    warnings: list[ConfigIssue] = field(default_factory=list)

    def error(self, path: str, message: str) -> None:
        self.errors.append(ConfigIssue(path, message))

    def warn(self, path: str, message: str) -> None:
        self.warnings.append(ConfigIssue(path, message))


def _loc_to_path(loc: tuple[Any, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            # Discriminated unions add the tag as a location element (e.g. 'ipo'); keep it readable.
            parts.append(("." if parts else "") + str(item))
    return "".join(parts)


def pydantic_issues(exc: Any, model_cls: type, *, source: str | None = None) -> list[ConfigIssue]:
    """Turn a pydantic ``ValidationError`` into ConfigIssues with "did you mean" hints for unknown keys."""
    issues = []
    for err in exc.errors(include_url=False):
        loc = tuple(err.get("loc", ()))
        path = _loc_to_path(loc)
        kind = err.get("type", "")
        msg = err.get("msg", "invalid value")
        if kind == "extra_forbidden":
            allowed = _allowed_keys(model_cls, loc[:-1])
            key = str(loc[-1]) if loc else ""
            hint = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
            msg = f"unknown key '{key}'"
            variants = _other_variants_with(model_cls, loc[:-1], key)
            if variants and isinstance(loc[-2], str) and len(loc) >= 3:
                where = _loc_to_path(loc[:-2])
                msg += (f" for {where}.type = '{loc[-2]}'; it belongs to type "
                        + " or ".join(f"'{v}'" for v in variants) + f": set {where}.type")
            elif hint:
                msg += f"; did you mean '{hint[0]}'?"
            if allowed:
                msg += f" (allowed here: {', '.join(sorted(allowed))})"
        elif kind in ("union_tag_invalid", "union_tag_not_found"):
            if err.get("ctx"):
                msg = f"'type' must be one of {err['ctx'].get('expected_tags', '?')}"
        elif kind.startswith("literal_error"):
            pass  # pydantic's message already lists the allowed values
        elif kind == "value_error":
            msg = msg.removeprefix("Value error, ")
            # Model-level checks name their field first ("lr: expects a number ..."): move it into the path.
            field, sep, rest = msg.partition(": ")
            if sep and field.isidentifier():
                path, msg = (f"{path}.{field}" if path else field), rest
        else:
            got = err.get("input")
            if not isinstance(got, (dict, list)) and got is not None:
                msg = f"{msg} (got {got!r})"
        issues.append(ConfigIssue(path, msg, source))
    return issues


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _allowed_keys(model_cls: type, loc: tuple[Any, ...]) -> list[str]:
    """Field names of the (nested) model at ``loc``; best effort through lists, dicts and unions."""
    current = _annotation_at(model_cls, loc)
    if current is None:
        return []
    if _is_model(current):
        return list(current.model_fields)
    return sorted({k for m in typing.get_args(current) if _is_model(m) for k in m.model_fields})


def _other_variants_with(model_cls: type, loc: tuple[Any, ...], key: str) -> list[str]:
    """Tags of the union members that accept ``key`` when ``loc`` ends in ``(<union field>, <tag>)``: an unknown key
    of one variant that another variant has (``deployment.single_node.num_train_nodes``)."""
    if len(loc) < 2:
        return []
    union = _annotation_at(model_cls, loc[:-1])
    members = [m for m in typing.get_args(union) if _is_model(m)]
    return [str(m.model_fields["type"].default) for m in members if key in m.model_fields and "type" in m.model_fields]


def _annotation_at(model_cls: type, loc: tuple[Any, ...]) -> Any:
    """The model class (or union of them) at ``loc`` below ``model_cls``; None when the path leaves the schema."""
    current: Any = model_cls
    for item in loc:
        if isinstance(item, int):
            continue
        fld = current.model_fields.get(str(item)) if _is_model(current) else None
        if fld is None:
            # A union member tag inside the location (discriminated unions).
            current = _pick_union_member(current, str(item))
            if current is None:
                return None
        else:
            current = _strip(fld.annotation)
    return current


def _strip(annotation: Any) -> Any:
    """Unwrap Optional / list / Annotated to the model class inside, if any."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Annotated, list, tuple):
        return _strip(typing.get_args(annotation)[0])
    if origin is not None:
        models = [a for a in typing.get_args(annotation) if _is_model(a)]
        if len(models) == 1:
            return models[0]
        if models:
            return typing.Union[tuple(models)]  # noqa: UP007
    return annotation


def _pick_union_member(annotation: Any, tag: str) -> Any:
    for member in typing.get_args(annotation):
        if _is_model(member):
            t = member.model_fields.get("type")
            if t is not None and t.default == tag:
                return member
    return None
