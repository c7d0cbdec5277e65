"""srl sft chain refuses, before anything is read or written, a second --then and a --model.name for the RL half
(which the chain replaces with the SFT run's final model)."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolkit.commands.sft import cmd_chain
from toolkit.config import ConfigError

JOBS = Path(__file__).resolve().parents[2] / "jobs" / "reverse-text"


@pytest.mark.parametrize(
    ("rl_half", "words"),
    [
        (["@", str(JOBS / "rl.toml"), "--then", "@", str(JOBS / "rl.toml")], "--then is given twice"),
        (["@", str(JOBS / "rl.toml"), "--model.name", "tiny-qwen3"], "--model.name"),
        (["@", str(JOBS / "rl.toml"), "--model.name=tiny-qwen3"], "--model.name"),
    ],
    ids=["two-thens", "model-name", "model-name-equals"],
)
def test_refused_before_anything_is_written(tmp_path: Path, rl_half: list[str], words: str) -> None:
    out = tmp_path / "out"
    sft_half = ["@", str(JOBS / "sft.toml"), "--dry-run", "--output-dir", str(out)]
    with pytest.raises(ConfigError) as exc:
        cmd_chain([*sft_half, "--then", *rl_half])
    assert words in str(exc.value), str(exc.value)
    assert not out.exists()
