"""Command-line mistakes a newcomer makes first (issue 34 item 9): each answer names the user's own input.

- ``srl rl file.toml`` (no ``@``) answered "give at least one config file: srl rl @ jobs/reverse-text/rl.toml".
- ``srl sweep ... --sweep.seeds [..]`` said "unknown key 'sweep'; did you mean 'seed'?" once per sweep point (six
  times for the example sweep); ``srl rl ... --sweep.seeds`` suggested ``seed`` too.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from toolkit.cli import main

REPO = Path(__file__).resolve().parents[2]
JOBS = REPO / "jobs" / "reverse-text"


@pytest.mark.parametrize("command", ["rl", "sft", "sweep"])
def test_a_file_without_at_is_named_with_the_fix(command: str, tmp_path: Path, capsys) -> None:
    mine = tmp_path / "my-job.toml"
    mine.write_text("max_steps = 3\n")
    assert main([command, str(mine)]) == 2
    err = capsys.readouterr().err
    assert f"@ {mine}" in err and "jobs/reverse-text" not in err


def test_a_toml_value_of_an_override_is_still_a_value() -> None:
    from toolkit.config.cli_args import split_config_args

    files, rest, _ = split_config_args(["@", "a.toml", "--data.name", "rows.toml"])
    assert files == [Path("a.toml")] and rest == ["--data.name", "rows.toml"]


def test_sweep_settings_on_the_command_line_are_refused_once(tmp_path: Path, capsys) -> None:
    argv = [
        "sweep",
        "@",
        str(JOBS / "sweep.toml"),
        "--sweep.seeds",
        "[0, 1]",
        "--output-dir",
        str(tmp_path),
        "--dry-run",
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "(1 problem)" in err and err.count("sweep.seeds") == 1, err
    assert "did you mean" not in err and "sweep file" in err
    assert not any(tmp_path.iterdir())  # nothing written


def test_a_run_config_with_sweep_settings_points_at_srl_sweep(capsys) -> None:
    assert main(["rl", "@", str(JOBS / "rl.toml"), "--sweep.seeds", "[0, 1]", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "did you mean 'seed'" not in err and "srl sweep @ FILE" in err, err
