"""Hostile but realistic input to srl's newest commands (sweep, export, status, sampling, SFT): each is refused
with a message naming the field or file, or handled, before anything is submitted or written."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolkit.config import ConfigError
from toolkit.launch.sweeps import plan_arrays
from toolkit.sweep import load_sweep

ROOT = Path(__file__).resolve().parents[2]
RT = ROOT / "jobs" / "reverse-text"


def _sweep_file(tmp_path: Path, sweep_lines: str) -> Path:
    f = tmp_path / "sweep.toml"
    f.write_text(f'[sweep]\nname = "s"\nbase = ["{RT / "rl.toml"}"]\n{sweep_lines}\n'
                 '[sweep.grid]\n"trainer.optim.lr" = [1e-4, 2e-4]\n')
    return f


@pytest.mark.parametrize("line", ["max_parallel = true", "seeds = [true, false]"])
def test_sweep_refuses_booleans_for_counts_and_seeds(tmp_path, line):
    # TOML true is a Python int subclass: it ran as max_parallel 1 / seeds 1, 0 without a word.
    with pytest.raises(ConfigError, match=r"sweep\.(max_parallel|seeds)"):
        load_sweep(_sweep_file(tmp_path, line))


def test_huge_max_parallel_throttle_stays_within_the_array():
    # max_parallel = 99999999999999999 rendered --array=0-5%99999999999999999, which sbatch refuses after every
    # point's run directory was written.
    chunks = plan_arrays([(6, True)], 99_999_999_999_999_999, 1001)
    assert [(len(c.points), c.throttle) for c in chunks] == [(6, 6)]
    chunks = plan_arrays([(3, True), (2, True)], 10**12, 1001)
    assert [c.throttle for c in chunks] == [3, 2]
