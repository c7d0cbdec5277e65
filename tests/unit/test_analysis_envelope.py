"""Resource envelope formulas and parameter counting from safetensors headers."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from analysis import envelope


def _safetensors(path: Path, shapes: dict[str, list[int]]) -> None:
    header, offset = {}, 0
    for name, shape in shapes.items():
        n = 2
        for d in shape:
            n *= d
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)


def test_formulas() -> None:
    assert envelope.gpu_hours(2, 8, 1800) == 8.0
    assert envelope.checkpoint_disk_bytes(0.6e9, keep_last=2) == pytest.approx(3 * 12 * 0.6e9)
    assert envelope.store_growth_bytes(1000, 100) == 1000 * (256 + 900)
    assert envelope.trainer_memory_per_gpu_bytes(1e9, 8) == 2e9
    with_act = envelope.trainer_memory_per_gpu_bytes(
        1e9, 8, tokens_per_micro_batch=1024, hidden_size=1024, num_layers=10, vocab_size=1000
    )
    assert with_act == 2e9 + 2 * 1024 * 1024 * 10 + 34 * 1024 * 1024 + 4 * 1024 * 1000
    assert envelope.inference_weights_per_gpu_bytes(1e9, 2) == 1e9


def test_count_parameters_and_estimate(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    _safetensors(model / "model-00001.safetensors", {"a": [4, 8], "b": [8]})
    _safetensors(model / "model-00002.safetensors", {"c": [2, 3, 5]})
    (model / "config.json").write_text(
        json.dumps({"hidden_size": 8, "num_hidden_layers": 2, "vocab_size": 4, "num_attention_heads": 2})
    )
    assert envelope.count_parameters(model) == 32 + 8 + 30
    assert envelope.count_parameters(tmp_path / "none") is None
    cfg = {
        "model": {"name": str(model)},
        "ckpt": {"keep_last": 1},
        "deployment": {"type": "multi_node", "gpus_per_node": 4, "num_train_nodes": 1, "num_infer_nodes": 2},
        "trainer": {"seq_len": 16, "micro_batch_size": 2},
    }
    env = envelope.estimate(cfg, wall_seconds=3600, store_path=None, steps=None)
    assert (env.num_nodes, env.gpus_per_node, env.gpu_hours) == (3, 4, 12.0)
    assert env.checkpoint_disk_bytes == 2 * 12 * 70
    assert env.trainer_memory_per_gpu_bytes == pytest.approx(16 * 70 / 4 + 2 * 32 * 8 * 2 + 34 * 32 * 8 + 4 * 32 * 4)
    labels = [k for k, _ in env.rows()]
    assert "GPU-hours (nodes x GPUs/node x wall h)" in labels
    unknown = envelope.estimate({}, wall_seconds=None, store_path=None, steps=None)
    assert unknown.gpu_hours is None and unknown.notes


def test_alias_and_broadcast_give_the_parameter_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A built-in alias is found in the model cache without building it; an alias not built (or a hub name the
    # report machine cannot see) falls back to the run's newest weight broadcast, which is the policy itself.
    cache = tmp_path / "cache"
    built = cache / "tiny-qwen3"
    built.mkdir(parents=True)
    (built / "config.json").write_text("{}")
    _safetensors(built / "model.safetensors", {"w": [3, 4]})
    monkeypatch.setenv("SRL_CACHE_DIR", str(cache))
    cfg = {"model": {"name": "tiny-qwen3"}, "ckpt": {"keep_last": 1}}
    assert envelope.estimate(cfg, wall_seconds=None, store_path=None, steps=None).num_params == 12
    broadcast = tmp_path / "run" / "broadcasts" / "step_3"
    broadcast.mkdir(parents=True)
    _safetensors(broadcast / "model.safetensors", {"w": [5, 5]})
    other = {"model": {"name": "smollm2-135m"}, "ckpt": {"keep_last": 1}}  # not built in this cache
    env = envelope.estimate(other, wall_seconds=None, store_path=None, steps=None, weights_dirs=[broadcast])
    assert env.num_params == 25 and env.checkpoint_disk_bytes == 2 * 12 * 25
    assert not (cache / "smollm2-135m").exists()  # a report never builds a model
    none = envelope.estimate(other, wall_seconds=None, store_path=None, steps=None)
    assert none.num_params is None and any("parameter count unknown" in n for n in none.notes)
