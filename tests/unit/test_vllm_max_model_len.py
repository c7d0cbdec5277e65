"""[inference.vllm] max_model_len is checked as vLLM reads it before anything is written: 'abc', 0 or 1e8 reached
the engine's argv and made it exit at start-up, inside the job."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolkit.config import ConfigError, load_config

RL = Path(__file__).resolve().parents[2] / "jobs" / "reverse-text" / "rl.toml"


@pytest.mark.parametrize("value", ["abc", "0", "1e8", "1.5K", "-2", "12 k"])
def test_refused_naming_the_key(value: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_config([RL], ["--inference.vllm.max-model-len", value])
    assert "inference.vllm.max_model_len" in str(exc.value) and "32k" in str(exc.value)


@pytest.mark.parametrize("value", ["512", "-1", "auto", "32k", "25.6k", "2K"])
def test_what_vllm_reads_passes(value: str) -> None:
    load_config([RL], ["--inference.vllm.max-model-len", value])
