"""Models srl can use without a model hub: a tiny local model, SmolLM2 from a PyPI wheel, and name resolution.

Importing this package is light (no torch, no transformers): the builders import them when called, so the
config validator and the CLI on a login node can use :data:`MODEL_ALIASES` and :func:`resolve_model` freely.

Public API:
  build_tiny_model(out_dir, *, seed=0) -> Path                  random-init char-level ChatML Qwen3 (fp32, untied)
  import_smollm2(out_dir) -> Path                               SmolLM2-135M-Instruct, bf16, untied
  resolve_model(name, cache_dir=None) -> Path                   directory or alias -> HF directory
  MODEL_ALIASES: dict[str, str]                                 alias -> one-line description
  renderer.load_renderer(cfg, model_dir) -> Renderer            chat messages <-> token ids (RL rollouts and SFT data
                                                                share it, so both see the same ids)

Modules: ``tiny`` (the tiny model), ``smollm2`` (SmolLM2 from a wheel), ``resolve`` (names and aliases),
``renderer`` (chat messages <-> token ids), ``cli`` (``srl model``).
"""

from __future__ import annotations

from toolkit.models.resolve import MODEL_ALIASES, resolve_model
from toolkit.models.smollm2 import import_smollm2
from toolkit.models.tiny import build_tiny_model

__all__ = ["MODEL_ALIASES", "build_tiny_model", "import_smollm2", "resolve_model"]
