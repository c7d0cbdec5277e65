"""analysis/ must import without torch (it runs on login nodes and in report jobs)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_analysis_imports_no_torch() -> None:
    code = (
        "import sys\n"
        "import analysis, toolkit.run.store, analysis.loaders, analysis.summary, analysis.figures, analysis.report, "
        "analysis.diagnose, analysis.envelope, analysis.samples\n"
        "bad = [m for m in ('torch', 'vllm', 'matplotlib.pyplot') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=False, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_stop_criteria_import_is_free() -> None:
    """The orchestrator imports the stop criteria (toolkit.run.stop) on its hot path: no pandas, numpy or h5py behind
    it."""
    code = (
        "import sys\n"
        "import toolkit.run.stop\n"
        "bad = [m for m in ('pandas', 'numpy', 'h5py', 'matplotlib') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=False, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
