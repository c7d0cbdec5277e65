"""Relative paths in ``env_vars`` tables made absolute from where srl runs, once, when a config is loaded.

A job's processes start elsewhere (a Slurm job in its run directory, on another node), so ``PYTHONPATH =
"my_envs"`` would name a different directory there than the one the login node's checks looked at. Every value of a
variable known to hold a path (or a ``os.pathsep``-separated list of them) is resolved against the directory srl
runs in, as relative dataset paths are; the resolved config (``configs/attempt_<n>/resolved/``) and every check after
loading see the absolute value, which is what the job gets. ``~`` is expanded (Python does not expand it in
``PYTHONPATH``); an entry that starts with ``$`` is left to the node's shell, and empty entries stay as they are.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel

PATH_LIST_VARS = frozenset({"PYTHONPATH", "PATH", "LD_LIBRARY_PATH"})
"""Variables holding an ``os.pathsep``-separated list of paths."""
PATH_VARS = frozenset({
    "HF_HOME", "HF_HUB_CACHE", "HF_DATASETS_CACHE", "TRANSFORMERS_CACHE", "XDG_CACHE_HOME", "TMPDIR",
    "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "VLLM_CACHE_ROOT", "FLASHINFER_WORKSPACE_BASE",
    "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
})  # fmt: skip
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
    PYTHONPATH: my_envs -> /home/u/proj/my_envs``). Raises nothing."""
    root = Path.cwd() if base is None else Path(base)
    changed = []
    for path, table in env_tables(model):
        for key, value in list(table.items()):
            if key not in PATH_LIST_VARS and key not in PATH_VARS or not isinstance(value, str):
                continue
            parts = value.split(os.pathsep) if key in PATH_LIST_VARS else [value]
            new = os.pathsep.join(_absolute(p, root) for p in parts)
            if new != value:
                table[key] = new
                changed.append(f"{path}.{key}: {value} -> {new}")
    return changed


def _absolute(entry: str, root: Path) -> str:
    if not entry or entry.startswith("$"):
        return entry
    path = Path(entry).expanduser()
    return str(path if path.is_absolute() else root / path)
