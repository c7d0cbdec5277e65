"""Run configs: schema, composition and the rules that read nothing but the config. Light: pydantic and the
standard library only (no torch/vllm), and no other toolkit package, so any layer may import it.

Modules:

- ``model``: the pydantic schema of a run (``RLConfig`` and its sections); ``site``: the schema of a site file;
  ``sft``: the SFT run config (``SFTConfig``) and its launch view, checked by the same rules.
- ``cli_args``: the command line of every run-shaped command (``@`` files, srl's flags, dotted overrides).
- ``envpaths``: relative paths in ``env_vars`` tables made absolute from where srl runs.
- ``compose``: TOML files merged left to right, dotted ``--a.b VALUE`` overrides, where each value came from.
- ``convert``: other shapes (legacy v0, hosted flat) mapped to the canonical one.
- ``rules``, ``arg_rules``: cross-field rules (groups and batches, GPUs, Slurm fields, secrets, pass-through args).
- ``passthrough``: reading the ``[inference.vllm]`` table (one spelling per option name).
- ``errors``: ``ConfigError`` / ``ConfigIssue`` / ``Findings``; ``schema_help``: ``srl rl --help``;
  ``slurm_time``: Slurm's time formats.

Checks of the outside world (site files, tasksets, models, run directories, placement) are
:mod:`toolkit.preflight`'s. Typical use::

    loaded = load_config([Path("jobs/reverse-text/rl.toml")], ["--orchestrator.batch-size", "64"])
    cfg = loaded.config          # RLConfig, canonical shape
    loaded.warnings              # list[ConfigIssue]
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from . import rules
from .compose import merge_layers, origin_of
from .convert import to_canonical
from .envpaths import absolute_env_paths
from .errors import ConfigError, ConfigIssue, pydantic_issues
from .model import NULL_SPELLING, RLConfig

__all__ = [
    "ConfigError",
    "ConfigIssue",
    "LoadedConfig",
    "RLConfig",
    "load_config",
    "load_resolved",
    "name_sources",
    "toml_data",
    "validate_dict",
]


@dataclass
class LoadedConfig:
    """A validated config plus what was learned while loading it."""

    config: RLConfig
    warnings: list[ConfigIssue] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    inputs: list[Path] = field(default_factory=list)
    purpose: str = "rl"
    """"rl" or "serve" (``srl inference``, which skips the rules about training)."""
    origins: dict[str, str] = field(default_factory=dict)
    """Field path -> the file (or "command line") that set it last; names the layer of a later finding."""


def name_sources(issues: list[ConfigIssue], origins: dict[str, str]) -> list[ConfigIssue]:
    """Fill each issue's ``source`` with the layer(s) that set its field (``origins`` from :func:`load_config`);
    a field nobody set (a default, a missing one) names none. Returns ``issues``."""
    for issue in issues:
        if issue.source is None:
            sources = [origin_of(p.strip(), origins) for p in issue.path.split(",")]
            issue.source = ", ".join(dict.fromkeys(s for s in sources if s)) or None
    return issues


def load_config(files: list[Path], overrides: list[str] | None = None, *, purpose: str = "rl") -> LoadedConfig:
    """Merge ``files`` left to right, apply CLI ``overrides``, map other shapes, validate fields and cross-field
    rules. ``purpose`` "serve" (``srl inference`` standalone) skips the rules about training envs, groups and async.

    Raises ConfigError listing every problem (file, field path, allowed values, fix) before anything is written.
    What the config points at outside itself is checked next, by :func:`toolkit.preflight.preflight`.
    """
    merged, origins, notices = merge_layers(files, overrides, shape=to_canonical)
    try:
        loaded = validate_dict(merged, purpose=purpose)
    except ConfigError as e:
        raise ConfigError(name_sources(e.issues, origins)) from None
    loaded.notices = notices + loaded.notices
    loaded.config.notices = list(loaded.notices)
    loaded.inputs = [Path(p) for p in files]
    loaded.origins = origins
    return loaded


def validate_dict(data: dict[str, Any], *, source: str | None = None, purpose: str = "rl") -> LoadedConfig:
    """Validate an already-merged canonical dict: fields, then the cross-field rules (``purpose`` as in
    :func:`load_config`). Relative paths in ``env_vars`` tables become absolute from the working directory
    (:mod:`toolkit.config.envpaths`; a notice names each). Raises ConfigError listing every problem."""
    try:
        cfg = RLConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(pydantic_issues(e, RLConfig, source=source)) from None
    # Before any rule or check reads them: the job sees these paths from its run directory, not from here.
    moved = [f"{line} (relative paths in env_vars are taken from where srl runs)" for line in absolute_env_paths(cfg)]
    found = rules.check(cfg, purpose=purpose)
    if found.errors:
        raise ConfigError(found.errors)
    return LoadedConfig(cfg, warnings=found.warnings, notices=moved, purpose=purpose)


def load_resolved(path: Path) -> RLConfig:
    """Load a resolved ``rl.json`` written by ``srl rl`` (already validated; validated again, cheaply)."""
    return RLConfig.model_validate(json.loads(Path(path).read_text()))


def toml_data(cfg: RLConfig) -> dict[str, Any]:
    """``cfg`` as the data of a TOML file that :func:`load_config` reads back into an equal config (what
    ``srl config show`` and ``srl config convert`` print, through ``tomli_w``).

    TOML has no null: a null field is left out where null is its default, and written as ``"None"`` (the spelling
    overrides use, which the schema reads as null) where it is not, e.g. ``ckpt.keep_last``, whose default is 2.
    ``notices`` is left out: it says what loading the input mapped, and loading the output maps nothing.
    """
    data = _toml_table(cfg)
    data.pop("notices", None)
    return data


def _toml_table(model: BaseModel) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, dumped in model.model_dump(mode="json").items():
        value = getattr(model, key, None)
        field = type(model).model_fields.get(key)
        if value is None:
            # An extra key (a taskset's own field) or a field whose default is null reloads as null when absent.
            if field is not None and field.get_default(call_default_factory=True) is not None:
                out[key] = NULL_SPELLING
        else:
            out[key] = _toml_value(value, dumped)
    return out


def _toml_value(value: Any, dumped: Any) -> Any:
    if isinstance(value, BaseModel):
        return _toml_table(value)
    if isinstance(value, (list, tuple)):
        return [_toml_value(v, d) for v, d in zip(value, dumped, strict=True) if v is not None]
    if isinstance(value, dict):
        return {k: _toml_value(value[k], d) for k, d in dumped.items() if value.get(k) is not None}
    return dumped
