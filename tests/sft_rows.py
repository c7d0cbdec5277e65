"""What the SFT unit tests share: JSON Lines files of rows, and the tiny model's renderer (built once)."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any


def write_jsonl(path: Path, rows: list) -> Path:
    """Write ``rows`` as one JSON document per line at ``path``; returns ``path``."""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@functools.cache
def tiny_renderer() -> Any:
    """The renderer of the built-in ``tiny-qwen3`` model (its chat template), as SFT and RL load it."""
    from toolkit.models import resolve_model
    from toolkit.models.renderer import load_renderer

    return load_renderer(None, resolve_model("tiny-qwen3"))
