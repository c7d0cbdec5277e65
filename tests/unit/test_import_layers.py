"""The packages keep their layer order: the import-linter contracts in pyproject.toml hold, and loading a config
loads no other toolkit package (so validation and dry runs stay light on a login node)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_import_contracts_hold():
    lint = Path(sys.executable).parent / "lint-imports"
    assert lint.exists(), "lint-imports is missing: install the dev extra (pip install -e '.[dev]')"
    out = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]


def test_loading_config_imports_no_other_toolkit_package():
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import toolkit.config"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    # importtime writes one line per module: "import time: self | cumulative | <indent>name".
    loaded = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}
    others = sorted(m for m in loaded if m.startswith("toolkit.") and not m.startswith("toolkit.config"))
    assert "toolkit.config" in loaded
    assert others == []
