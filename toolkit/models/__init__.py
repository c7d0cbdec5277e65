"""Models srl can use without a model hub: a tiny local model, SmolLM2 from a PyPI wheel, and name resolution.

Importing this package is light (no torch, no transformers): the builders import them when called, so the
config validator and the CLI on a login node can use :data:`MODEL_ALIASES` and :func:`resolve_model` freely.

Public API:
  build_tiny_model(out_dir, *, seed=0, arch="qwen3") -> Path   random-init char-level ChatML model (fp32, untied)
  import_smollm2(out_dir) -> Path                               SmolLM2-135M-Instruct, bf16, untied
  untie_embeddings(model_dir) -> bool                           rewrite a tied HF directory untied, in place
  resolve_model(name, cache_dir=None) -> Path                   directory or alias -> HF directory
  MODEL_ALIASES: dict[str, str]                                 alias -> one-line description
  renderer.load_renderer(cfg, model_dir) -> Renderer            chat messages <-> token ids (RL rollouts and SFT data
                                                                share it, so both see the same ids)
  cmd_build_tiny(dir, seed) / cmd_import_smollm2(dir) -> Path  CLI entry points

Modules: ``tiny`` (the tiny model), ``smollm2`` (SmolLM2 from a wheel), ``untie``, ``resolve`` (names and
aliases), ``renderer`` (chat messages <-> token ids), ``cli`` (``srl model``).
"""

from __future__ import annotations

from pathlib import Path

from toolkit.models.resolve import MODEL_ALIASES, default_cache_dir, resolve_model
from toolkit.models.smollm2 import import_smollm2
from toolkit.models.tiny import build_tiny_model
from toolkit.models.untie import is_tied, untie_embeddings

__all__ = [
    "MODEL_ALIASES",
    "build_tiny_model",
    "cmd_build_tiny",
    "cmd_import_smollm2",
    "default_cache_dir",
    "import_smollm2",
    "is_tied",
    "resolve_model",
    "untie_embeddings",
]


def cmd_build_tiny(dir: Path, seed: int = 0) -> Path:
    """``srl model build-tiny DIR --seed N``: build the tiny model into ``dir`` and return its path."""
    return build_tiny_model(Path(dir), seed=seed)


def cmd_import_smollm2(dir: Path) -> Path:
    """``srl model import-smollm2 DIR``: write SmolLM2-135M-Instruct into ``dir`` and return its path."""
    return import_smollm2(Path(dir))
