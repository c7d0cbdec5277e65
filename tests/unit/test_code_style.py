"""The code keeps one layout and one line length: ``ruff format --check`` and ``ruff check`` (imports, names, lines
of at most ``line-length`` characters; settings in pyproject.toml) pass on every package, test and report module."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TREES = ["toolkit", "tests", "analysis"]


@pytest.mark.parametrize("command", [["format", "--check", "--diff"], ["check", "--no-cache"]], ids=" ".join)
def test_ruff_passes(command: list[str]) -> None:
    ruff = Path(sys.executable).parent / "ruff"
    assert ruff.exists(), "ruff is missing: install the dev extra (pip install -e '.[dev]')"
    out = subprocess.run(
        [str(ruff), *command, *TREES], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert out.returncode == 0, (out.stdout[-6000:] + out.stderr[-2000:]) + (
        "\nfix with: .venv/bin/ruff format toolkit tests analysis && .venv/bin/ruff check --fix toolkit tests analysis"
    )
