"""Load, validate and resolve run configs. Light: imports pydantic and the standard library only (no torch/vllm).

Typical use::

    loaded = load_config([Path("jobs/reverse-text/rl.toml")], ["--orchestrator.batch-size", "64"])
    cfg = loaded.config          # RLConfig, canonical shape
    loaded.warnings              # list[ConfigIssue]
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from . import rules
from .compose import deep_merge, origin_of, parse_overrides, read_toml, record_origins
from .convert import to_canonical
from .errors import ConfigError, ConfigIssue, pydantic_issues
from .model import RLConfig

__all__ = [
    "ConfigError",
    "ConfigIssue",
    "LoadedConfig",
    "RLConfig",
    "load_config",
    "load_resolved",
    "role_view",
    "site_configs_dir",
    "validate_dict",
]


@dataclass
class LoadedConfig:
    """A validated config plus what was learned while loading it."""

    config: RLConfig
    warnings: list[ConfigIssue] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    inputs: list[Path] = field(default_factory=list)
    overrides: list[str] = field(default_factory=list)


def site_configs_dir() -> Path:
    """Directory of site TOMLs: ``$SRL_SITE_CONFIGS`` or the repository's ``site-configs/``."""
    env = os.environ.get("SRL_SITE_CONFIGS")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "site-configs"


def load_config(files: list[Path], overrides: list[str] | None = None, *, purpose: str = "rl") -> LoadedConfig:
    """Merge ``files`` left to right, apply CLI ``overrides``, map other shapes, validate everything.

    Raises ConfigError listing every problem (file, field path, allowed values, fix) before anything is written.
    """
    merged: dict[str, Any] = {}
    notices: list[str] = []
    origins: dict[str, str] = {}  # field path -> the file (or "command line") that set it last
    for path in files:
        raw = read_toml(Path(path))
        canon, got = to_canonical(raw, source=str(path))
        notices += got
        merged = deep_merge(merged, canon)
        record_origins(canon, str(path), origins)
    over = parse_overrides(list(overrides or []))
    if over:
        over, got = to_canonical(over, source="command line")
        notices += got
        merged = deep_merge(merged, over)
        record_origins(over, "command line", origins)
    try:
        loaded = validate_dict(merged, purpose=purpose)
    except ConfigError as e:
        # Name the layer each bad value came from; a field nobody set (a default, a missing one) names none.
        for issue in e.issues:
            if issue.source is None:
                sources = [origin_of(p.strip(), origins) for p in issue.path.split(",")]
                issue.source = ", ".join(dict.fromkeys(s for s in sources if s)) or None
        raise ConfigError(e.issues) from None
    loaded.notices = notices + loaded.notices
    loaded.config.notices = list(loaded.notices)
    loaded.inputs = [Path(p) for p in files]
    loaded.overrides = list(overrides or [])
    return loaded


def validate_dict(data: dict[str, Any], *, source: str | None = None, purpose: str = "rl") -> LoadedConfig:
    """Validate an already-merged canonical dict (fields, then cross-field rules, then the site name)."""
    try:
        cfg = RLConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(pydantic_issues(e, RLConfig, source=source)) from None
    found = rules.check(cfg, purpose=purpose)
    sites = sorted(p.stem for p in site_configs_dir().glob("*.toml"))
    if sites and cfg.site not in sites:
        found.error("site", f"unknown site '{cfg.site}'; allowed: {', '.join(sites)} (files in {site_configs_dir()})")
    elif sites:
        from .site import site_rules  # run-vs-site rules (accounting, GPU style, ports, placement)

        site_rules(cfg, found)
    if found.errors:
        raise ConfigError(found.errors)
    return LoadedConfig(cfg, warnings=found.warnings)


def load_resolved(path: Path) -> RLConfig:
    """Load a resolved ``rl.json`` written by ``srl rl`` (already validated; validated again, cheaply)."""
    return RLConfig.model_validate(json.loads(Path(path).read_text()))


# Sections each role receives in resolved/<role>.json (torchtitan-style: a role sees only its own part, plus the
# few shared top-level values it needs).
_ROLE_SECTIONS = {
    "trainer": ("trainer", "ckpt", "resume", "weight_broadcast", "monitors"),
    "orchestrator": ("orchestrator", "ckpt", "resume", "monitors"),
    "inference": ("inference",),
}
_SHARED = ("output_dir", "run", "max_steps", "seed", "model", "env_vars")


def role_view(cfg: RLConfig, role: str) -> dict[str, Any]:
    """The JSON-able part of ``cfg`` a role needs. Raises KeyError for an unknown role."""
    data = cfg.model_dump(mode="json")
    keys = _SHARED + _ROLE_SECTIONS[role]
    view = {k: data[k] for k in keys}
    if role == "trainer":
        view["max_async_level"] = cfg.orchestrator.max_async_level
    return view
