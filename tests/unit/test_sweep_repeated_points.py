"""A sweep file that would run the same point twice, or vary `seed` outside sweep.seeds (where each point's seed from
sweep.seeds silently replaced it, so every point ran with seed 0 while the manifest said otherwise), is refused
naming the field before anything is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolkit.config import ConfigError
from toolkit.sweep import load_sweep

RL = Path(__file__).resolve().parents[2] / "jobs" / "reverse-text" / "rl.toml"


def _sweep(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "sweep.toml"
    p.write_text(f'[sweep]\nname = "s"\nbase = ["{RL}"]\n{body}\n')
    return p


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ('[sweep.grid]\n"seed" = [0, 1]', "sweep.grid.seed"),
        ('[sweep.zip]\n"seed" = [0, 1]\n"trainer.optim.lr" = [1e-3, 2e-3]', "sweep.zip.seed"),
        ('[sweep.random]\nsamples = 2\n"seed" = {choice = [0, 1]}', "sweep.random.seed"),
        ('[sweep.grid]\n"trainer.optim.lr" = [1e-3, 2e-3, 1e-3]', "sweep.grid.trainer.optim.lr"),
        ('[sweep.zip]\n"trainer.optim.lr" = [1e-3, 1e-3]\n"max_steps" = [5, 5]', "sweep.zip"),
        ('seeds = [0, 1, 0]\n[sweep.grid]\n"trainer.optim.lr" = [1e-3]', "sweep.seeds"),
        ('[sweep.grid]\n"trainer.optim.lr" = [1e-3]\n[sweep.zip]\n"trainer.optim.lr" = [2e-3]', "trainer.optim.lr"),
    ],
    ids=["grid-seed", "zip-seed", "random-seed", "grid-repeat", "zip-repeat", "seeds-repeat", "grid-and-zip"],
)
def test_refused_naming_the_field(tmp_path: Path, body: str, words: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_sweep(_sweep(tmp_path, body))
    assert words in str(exc.value), str(exc.value)


def test_distinct_points_still_load(tmp_path: Path) -> None:
    body = 'seeds = [0, 1]\n[sweep.grid]\n"trainer.optim.lr" = [1e-3, 2e-3]\n[sweep.zip]\n"max_steps" = [5, 6]'
    sweep = load_sweep(_sweep(tmp_path, body))
    assert len(sweep.points) == 8
