"""Renderer selection: ``auto`` default, explicit names, a custom renderer by import path, clear errors."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from toolkit.models.renderer import RENDERERS, Renderer, load_renderer


class ByteRenderer:
    """A custom renderer outside srl's list: UTF-8 bytes as token ids (vocabulary of 256 + 1 stop id)."""

    name = "bytes"

    def __init__(self, model_path) -> None:
        self.model_path = model_path
        self.stop_token_ids = [256]

    def render(self, messages, *, add_generation_prompt=True):
        text = "".join(f"{m['role']}:{m['content']}\n" for m in messages) + (
            "assistant:" if add_generation_prompt else ""
        )
        return list(text.encode())

    def decode(self, token_ids):
        return bytes(t for t in token_ids if t < 256).decode(errors="replace")


class NotARenderer:
    def __init__(self, model_path) -> None:
        pass


def test_custom_renderer_by_import_path(tmp_path):
    cfg = SimpleNamespace(name="ignored-when-import-path-is-set", import_path=f"{__name__}:ByteRenderer")
    r = load_renderer(cfg, tmp_path)
    assert isinstance(r, Renderer) and r.name == "bytes" and r.model_path == tmp_path
    ids = r.render([{"role": "user", "content": "hé"}])
    assert r.decode(ids) == "user:hé\nassistant:"
    # The dotted spelling works too.
    assert load_renderer(SimpleNamespace(name=None, import_path=f"{__name__}.ByteRenderer"), tmp_path).name == "bytes"


def test_bad_renderers_fail_clearly(tmp_path):
    with pytest.raises(ValueError, match="unknown renderer 'nope'"):
        load_renderer(SimpleNamespace(name="nope", import_path=None), tmp_path)
    with pytest.raises(TypeError, match="NotARenderer lacks"):
        load_renderer(SimpleNamespace(name=None, import_path=f"{__name__}:NotARenderer"), tmp_path)
    with pytest.raises(ValueError, match="import_path"):
        load_renderer(SimpleNamespace(name=None, import_path="nodots"), tmp_path)


def test_builtin_names():
    assert set(RENDERERS) == {"auto", "plain", "hermes"}
