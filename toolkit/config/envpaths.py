"""Relative paths in ``env_vars`` tables made absolute from where srl runs, once, when a config is loaded.

A job's processes start elsewhere (a Slurm job in its run directory, on another node), so ``PYTHONPATH =
"my_envs"`` would name a different directory there than the one the login node's checks looked at. Every value of a
variable known to hold a path (or a ``os.pathsep``-separated list of them) is resolved against the directory srl
runs in, as relative dataset paths are; the resolved config (``configs/attempt_<n>/resolved/``) and every check after
loading see the absolute value, which is what the job gets. ``~`` is expanded (Python does not expand it in
``PYTHONPATH``) and empty entries stay as they are. A ``$VARIABLE`` is refused: no shell reads these values on the
way to the job's processes, which would get the text as written (a ``PYTHONPATH`` entry naming nothing, a ``PATH``
that drops the system's), and a login node's value may not hold on a compute node.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from .errors import ConfigError, ConfigIssue

PATH_LIST_VARS = frozenset({"PYTHONPATH", "PATH", "LD_LIBRARY_PATH"})
"""Variables holding an ``os.pathsep``-separated list of paths."""
PATH_VARS = frozenset(
    {
        "HF_HOME",
        "HF_HUB_CACHE",
        "HF_DATASETS_CACHE",
        "TRANSFORMERS_CACHE",
        "XDG_CACHE_HOME",
        "TMPDIR",
        "TRITON_CACHE_DIR",
        "TORCHINDUCTOR_CACHE_DIR",
        "VLLM_CACHE_ROOT",
        "FLASHINFER_WORKSPACE_BASE",
        "SSL_CERT_FILE",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
    }
)
"""Variables holding one path."""


def env_tables(model: BaseModel) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every ``*env_vars`` table in ``model`` and its sections, with its field path (``orchestrator.env_vars``)."""
    for name in type(model).model_fields:
        value = getattr(model, name, None)
        if name.endswith("env_vars") and isinstance(value, dict):
            yield name, value
        elif isinstance(value, BaseModel):
            for path, table in env_tables(value):
                yield f"{name}.{path}", table


def absolute_env_paths(model: BaseModel, base: Path | None = None) -> list[str]:
    """Rewrite, in place, each relative path in ``model``'s env tables (see the module docstring) as absolute from
    ``base`` (default: the working directory). Returns one line per value changed (``orchestrator.env_vars.
    PYTHONPATH: my_envs -> /home/u/proj/my_envs``). Raises ConfigError, before changing anything, naming each
    path variable whose value holds a ``$VARIABLE`` or a ``~user`` with no home on this machine."""
    root = Path.cwd() if base is None else Path(base)
    issues: list[ConfigIssue] = []
    changes: list[tuple[dict[str, Any], str, str, str]] = []
    for path, table in env_tables(model):
        for key, value in list(table.items()):
            if key not in PATH_LIST_VARS and key not in PATH_VARS or not isinstance(value, str):
                continue
            parts = value.split(os.pathsep) if key in PATH_LIST_VARS else [value]
            try:
                new = os.pathsep.join(_absolute(p, root) for p in parts)
            except ValueError as e:
                issues.append(ConfigIssue(f"{path}.{key}", f"{value!r}: {e}"))
                continue
            if new != value:
                changes.append((table, key, value, f"{path}.{key}"))
                table[key] = new
    if issues:
        for table, key, value, _ in changes:
            table[key] = value
        raise ConfigError(issues)
    return [f"{where}: {value} -> {table[key]}" for table, key, value, where in changes]


def _absolute(entry: str, root: Path) -> str:
    """``entry`` absolute from ``root`` (``~`` expanded; empty stays empty). Raises ValueError for a ``$VARIABLE``
    or a ``~user`` this machine has no home for."""
    if "$" in entry:
        raise ValueError(
            "srl does not expand $VARIABLES in env_vars: the job's processes would get the text as "
            "written; write the path out (an absolute path, one relative to where srl runs, or ~/...)"
        )
    if not entry:
        return entry
    try:
        path = Path(entry).expanduser()
    except RuntimeError:  # ~name with no such user
        user = entry[1:].split("/", 1)[0]
        raise ValueError(f"'~{user}' names no user with a home directory on this machine; write the path out") from None
    return str(path if path.is_absolute() else root / path)
