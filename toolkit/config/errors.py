"""Config errors that a researcher can act on: file, field path, what is allowed, and how to fix it."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from .model import models_in


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


# Top-level tables of other srl files that a run config does not have: what to say instead of the nearest run
# config key (``sweep`` is one letter from ``seed``).
_OTHER_FILES_KEYS = {
    "sweep": "[sweep] (name, base, seeds, grid, max_parallel) belongs to a sweep file, which `srl sweep @ FILE` "
    "reads; change it there (a run config, its overlays and --section.field overrides have no [sweep])",
}


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
                msg += (
                    f" for {where}.type = '{loc[-2]}'; it belongs to type "
                    + " or ".join(f"'{v}'" for v in variants)
                    + f": set {where}.type"
                )
            elif len(loc) == 1 and key in _OTHER_FILES_KEYS:
                msg += f": {_OTHER_FILES_KEYS[key]}"
                allowed = []  # the near names of a run config's keys would only mislead
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
        elif kind == "list_type" and isinstance(err.get("input"), dict) and _models_at(model_cls, loc):
            # A table where a list of tables goes: [path.<name>] amends the entry of that name in a list an earlier
            # layer defines; with no list before it there is nothing to amend.
            names = ", ".join(f"'{k}'" for k in err["input"])
            msg = (
                f"expected a list of tables ([[{path}]] entries), got a table; the table [{path}.<name>] "
                f"({names}) amends the entry of that name in a list of entries an earlier file gives, and none "
                f"gives any: compose it after the file holding the [[{path}]] entries"
            )
        else:
            got = err.get("input")
            if not isinstance(got, (dict, list)) and got is not None:
                msg = f"{msg} (got {got!r})"
        issues.append(ConfigIssue(path, msg, source))
    return issues


def _allowed_keys(model_cls: type, loc: tuple[Any, ...]) -> list[str]:
    """Field names of the (nested) model at ``loc``; best effort through lists, dicts and unions."""
    return sorted({k for m in _models_at(model_cls, loc) for k in m.model_fields})


def _other_variants_with(model_cls: type, loc: tuple[Any, ...], key: str) -> list[str]:
    """Tags of the union members that accept ``key`` when ``loc`` ends in ``(<union field>, <tag>)``: an unknown key
    of one variant that another variant has (``deployment.single_node.num_train_nodes``)."""
    members = _models_at(model_cls, loc[:-1]) if len(loc) >= 2 else []
    if len(members) < 2:  # not a union
        return []
    return [str(m.model_fields["type"].default) for m in members if key in m.model_fields and "type" in m.model_fields]


def _models_at(model_cls: type, loc: tuple[Any, ...]) -> list[type[BaseModel]]:
    """The model classes (the members of a union) at ``loc`` below ``model_cls``; [] when the path leaves the
    schema."""
    current = [model_cls]
    for item in (str(i) for i in loc if not isinstance(i, int)):
        if len(current) == 1 and item in current[0].model_fields:
            current = models_in(current[0].model_fields[item].annotation)
        elif len(current) > 1:  # a union member's tag inside the location (discriminated unions)
            current = [m for m in current if getattr(m.model_fields.get("type"), "default", None) == item]
        else:
            return []
    return current
