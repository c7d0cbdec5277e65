"""Golden files of rendered rl.sbatch for the issue's layouts; each render also passes ``bash -n`` (shellcheck runs
over the same renders in tests/integration/test_rl_sbatch_shellcheck.py).

Regenerate after an intended change with ``SRL_UPDATE_GOLDEN=1 pytest tests/unit/test_render_golden.py``: each
layout whose render differs is written and its test fails, naming the file to review; a rerun without the switch
then passes.
"""

from __future__ import annotations

import difflib
import os
import subprocess
from pathlib import Path

import pytest
from golden.layouts import LAYOUTS, render

GOLDEN = Path(__file__).resolve().parents[1] / "golden"


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_golden(layout: str, tmp_path: Path) -> None:
    text = render(layout)
    script = tmp_path / f"{layout}.sbatch"
    script.write_text(text)
    subprocess.run(["bash", "-n", str(script)], check=True)
    golden = GOLDEN / f"{layout}.sbatch"
    want = golden.read_text() if golden.exists() else None
    if text == want:
        return
    if os.environ.get("SRL_UPDATE_GOLDEN") == "1":
        # Never a pass: an updated golden file compared with the render it came from would prove nothing.
        golden.write_text(text)
        pytest.fail(f"{layout}: wrote {golden}; review its diff, then rerun without SRL_UPDATE_GOLDEN")
    assert want is not None, f"missing {golden}; run with SRL_UPDATE_GOLDEN=1"
    diff = "".join(difflib.unified_diff(want.splitlines(True), text.splitlines(True), str(golden), "rendered", n=2))
    pytest.fail(f"{layout}: rendered script differs from {golden}:\n{diff}")
