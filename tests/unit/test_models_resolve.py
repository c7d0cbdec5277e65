"""Unit tests of model-name resolution (directories, aliases, cache) and of the package staying light."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from prereqs import need_module

from toolkit.models import MODEL_ALIASES, resolve_model
from toolkit.models.resolve import default_cache_dir


def test_import_does_not_load_torch_or_transformers():
    code = (
        "import sys, toolkit.models\n"
        "heavy = [m for m in ('torch', 'transformers', 'tokenizers', 'safetensors', 'vllm') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_aliases_have_descriptions():
    assert {"tiny-qwen3", "smollm2-135m"} <= set(MODEL_ALIASES)
    assert all(isinstance(v, str) and v and "\n" not in v for v in MODEL_ALIASES.values())


def test_existing_hf_directory_is_returned_as_is(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model(str(tmp_path)) == tmp_path


def test_directory_without_config_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        resolve_model(str(tmp_path))


def test_unknown_name_lists_allowed_aliases(tmp_path):
    with pytest.raises(ValueError) as err:
        resolve_model("gpt-17-ultra", cache_dir=tmp_path)
    assert "tiny-qwen3" in str(err.value) and "smollm2-135m" in str(err.value)
    assert not any(tmp_path.iterdir())  # nothing built, no lock file


def test_cache_dir_comes_from_env(monkeypatch, tmp_path):
    monkeypatch.setenv("SRL_CACHE_DIR", str(tmp_path))
    assert default_cache_dir() == tmp_path
    monkeypatch.delenv("SRL_CACHE_DIR")
    assert default_cache_dir() == Path.home() / ".cache" / "srl" / "models"


def test_alias_builds_once_into_cache(tmp_path):
    need_module("torch")
    first = resolve_model("tiny-qwen3", cache_dir=tmp_path)
    assert first == tmp_path / "tiny-qwen3" and (first / "model.safetensors").is_file()
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    inode = first.stat().st_ino
    second = resolve_model("tiny-qwen3", cache_dir=tmp_path)
    assert second == first and first.stat().st_ino == inode
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp
    # Only the model and its lock file: no temporary directories left behind.
    assert sorted(p.name for p in tmp_path.iterdir()) == [".tiny-qwen3.lock", "tiny-qwen3"]


def test_directory_named_like_an_alias_wins(tmp_path, monkeypatch):
    (tmp_path / "tiny-qwen3").mkdir()
    (tmp_path / "tiny-qwen3" / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    assert resolve_model("tiny-qwen3", cache_dir=tmp_path / "cache") == Path("tiny-qwen3")
    assert not (tmp_path / "cache").exists()
