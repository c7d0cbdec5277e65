"""Secrets travel by name only: an env_vars entry named like a key (..._KEY) is refused like ..._API_KEY, and a
value pasted into slurm.secret_env_vars in place of a name is refused without being echoed back."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolkit.config import ConfigError, load_config

RL = Path(__file__).resolve().parents[2] / "jobs" / "reverse-text" / "rl.toml"


@pytest.mark.parametrize("name", ["WANDB_KEY", "OPENAI_KEY", "trainer.env-vars.SSH_KEY", "KEY"])
def test_key_named_env_var_is_refused(name: str) -> None:
    path = name if "." in name else f"env-vars.{name}"
    with pytest.raises(ConfigError) as exc:
        load_config([RL], [f"--{path}", "value"])
    assert "looks like a secret" in str(exc.value)


@pytest.mark.parametrize("name", ["MONKEY", "KEYBOARD_LAYOUT", "OMP_NUM_THREADS"])
def test_other_names_pass(name: str) -> None:
    load_config([RL], [f"--env-vars.{name}", "x"])


def test_pasted_secret_in_secret_env_vars_is_not_echoed() -> None:
    with pytest.raises(ConfigError) as exc:
        load_config([RL], ["--slurm.secret-env-vars", '["WANDB_API_KEY", "sk-live-abc123"]'])
    text = str(exc.value)
    assert "slurm.secret_env_vars" in text and "item 2" in text and "sk-live-abc123" not in text


@pytest.mark.parametrize("path", ["env-vars.OMP_NUM_THREADS", "trainer.env-vars.OMP_NUM_THREADS"])
def test_a_number_given_to_an_env_var_is_its_text(path: str) -> None:
    """``--env-vars.OMP_NUM_THREADS 4`` reads as the number 4: it was refused as "not a valid string"."""
    cfg = load_config([RL], [f"--{path}", "4"]).config
    table = cfg.env_vars if path.startswith("env") else cfg.trainer.env_vars
    assert table["OMP_NUM_THREADS"] == "4"


def test_a_boolean_env_var_value_stays_refused() -> None:
    with pytest.raises(ConfigError, match="env_vars.DEBUG"):
        load_config([RL], ["--env-vars.DEBUG"])


def test_help_shows_env_var_tables_as_plain_text_maps() -> None:
    from toolkit.config.schema_help import schema_help

    text = schema_help()
    assert "  env_vars (dict[str, str], default {})" in text and "Annotated" not in text
