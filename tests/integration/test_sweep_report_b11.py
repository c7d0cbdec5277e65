"""Field case B11 through the whole report: `srl report <sweep root>` lists each array task (``A_T``, the name of
its log) next to its point, and the sweep table has one row per point. Unit-level pieces: tests/unit/test_sweep_b11.py;
the same on a real array: tests/integration/test_sweep_slurm.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from test_sweep_b11 import make_sweep_runs

from analysis.report import main
from toolkit.run.layout import RunDir

pytestmark = [pytest.mark.slow]


def test_report_on_sweep_root_joins_each_task_to_its_point(tmp_path: Path) -> None:
    root = make_sweep_runs(tmp_path)
    assert main([str(root), "--no-run-figures"]) == 0
    tables = RunDir(root).reports / "tables"
    runs = pd.read_csv(tables / "sweep_runs.csv")
    assert list(runs["run"]) == ["p000", "p002"]
    assert list(runs["array_task"]) == ["77_0", "77_2"]
    assert list(runs["point"]) == ["trainer.optim.lr=1e-06", "trainer.optim.lr=1e-05"]
    table = pd.read_csv(tables / "sweep.csv")
    assert set(table.loc[table["metric"] == "reward/all/mean", "point"]) == set(runs["point"])


def test_report_on_sweep_with_no_point_started_fails_cleanly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = make_sweep_runs(tmp_path, ran=())
    assert main([str(root)]) == 2
    assert "no point run directory yet" in capsys.readouterr().err
