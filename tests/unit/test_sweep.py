"""Sweep expansion and validation before submission."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolkit.config import ConfigError
from toolkit.sweep import load_sweep, point_config, point_configs, write_manifest

ROOT = Path(__file__).resolve().parents[2]


def test_grid_times_seeds_expands_and_validates(tmp_path):
    sweep = load_sweep(ROOT / "jobs" / "reverse-text" / "sweep.toml")
    assert len(sweep.points) == 6
    assert [(p.params["trainer.optim.lr"], p.seed) for p in sweep.points[:3]] == [(3e-4, 0), (3e-4, 1), (3e-4, 2)]
    cfgs = [point_config(sweep, p, tmp_path).config for p in sweep.points]
    assert {c.trainer.optim.lr for c in cfgs} == {3e-4, 1e-3}
    assert [c.run.name for c in cfgs] == [f"p{i:03d}" for i in range(6)]
    assert all(c.max_steps == 30 for c in cfgs)
    manifest = write_manifest(sweep, tmp_path / sweep.name)
    assert manifest.exists()


def test_zip_and_random(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text(f"""
[sweep]
name = "z"
base = ["{ROOT}/jobs/reverse-text/rl.toml"]
[sweep.zip]
"trainer.optim.lr" = [1e-4, 2e-4]
"orchestrator.group_size" = [8, 16]
[sweep.random]
samples = 3
"trainer.optim.weight_decay" = {{ uniform = [0.0, 0.1] }}
""")
    sweep = load_sweep(f)
    assert len(sweep.points) == 6
    assert {(p.params["trainer.optim.lr"], p.params["orchestrator.group_size"]) for p in sweep.points} == {
        (1e-4, 8),
        (2e-4, 16),
    }
    assert all(0 <= p.params["trainer.optim.weight_decay"] <= 0.1 for p in sweep.points)


def test_one_bad_point_fails_whole_sweep_before_submission(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text(f"""
[sweep]
name = "bad"
base = ["{ROOT}/jobs/reverse-text/rl.toml"]
[sweep.grid]
"orchestrator.batch_size" = [64, 100]
""")
    sweep = load_sweep(f)
    with pytest.raises(ConfigError) as e:
        point_configs(sweep, tmp_path)
    assert "p001" in str(e.value) and "batch_size" in str(e.value)
    assert not (tmp_path / "bad").exists()


def test_every_failing_point_is_named_at_once(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text(f"""
[sweep]
name = "bad"
base = ["{ROOT}/jobs/reverse-text/rl.toml"]
[sweep.grid]
"orchestrator.batch_size" = [64, 100, 63, 65, 66, 67, 68, 69]
""")
    with pytest.raises(ConfigError) as e:
        point_configs(load_sweep(f), tmp_path)
    text = str(e.value)
    assert [pid for pid in ("p001", "p002", "p003", "p004", "p005") if f"[{pid} " in text] == [
        "p001",
        "p002",
        "p003",
        "p004",
        "p005",
    ], text  # the first five failing points in full
    assert "[p000 " not in text and "2 more of the 8 points fail (p006, p007)" in text, text


@pytest.mark.parametrize(
    "body",
    [
        '[sweep]\nname="x"\n',
        '[sweep]\nname="x"\nbase=["a.toml"]\nseeds="0"\n',
        '[sweep]\nname="x"\nbase=["a"]\nbogus=1\n',
        "[other]\n",
    ],
)
def test_bad_sweep_files(tmp_path, body):
    f = tmp_path / "s.toml"
    f.write_text(body)
    with pytest.raises(ConfigError):
        load_sweep(f)
