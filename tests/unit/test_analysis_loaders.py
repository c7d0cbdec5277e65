"""metrics.jsonl and run-directory loaders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from analysis_runs import make_run

from analysis.loaders import load_metrics, load_run, role_metrics
from toolkit.fsutil import append_jsonl
from toolkit.run.layout import RunDir


def test_one_row_per_role_and_step_later_wins(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    append_jsonl(run.metrics, {"step": 1, "time": 10.0, "role": "trainer", "loss/mean": 0.5})
    append_jsonl(run.metrics, {"step": 1, "time": 11.0, "role": "orchestrator", "reward/all/mean": 0.2})
    append_jsonl(run.metrics, {"step": 2, "time": 12.0, "role": "trainer", "metrics": {"loss/mean": 0.4}})
    # a requeued attempt logs step 1 again; eval metrics arrive on their own line
    append_jsonl(run.metrics, {"step": 1, "time": 20.0, "role": "trainer", "loss/mean": 0.7})
    append_jsonl(run.metrics, {"step": 1, "time": 21.0, "role": "orchestrator", "eval/a/avg@4": 0.3})
    with open(run.metrics, "a") as f:
        f.write('{"step": 3, "role": "trainer", "loss/me')  # writer killed mid-line
    df = load_metrics(tmp_path)
    assert df.attrs["skipped_lines"] == 1
    assert list(zip(df["role"], df["step"])) == [("orchestrator", 1), ("trainer", 1), ("trainer", 2)]
    tr = role_metrics(df, "trainer")
    assert tr.loc[1, "loss/mean"] == 0.7 and tr.loc[2, "loss/mean"] == 0.4
    assert "reward/all/mean" not in tr.columns
    orch = role_metrics(df, "orchestrator")
    assert orch.loc[1, "reward/all/mean"] == 0.2 and orch.loc[1, "eval/a/avg@4"] == 0.3


def test_missing_metrics_file(tmp_path: Path) -> None:
    df = load_metrics(tmp_path)
    assert df.empty and {"role", "step", "time"} <= set(df.columns)
    assert role_metrics(df, "trainer").empty


def test_load_run(tmp_path: Path) -> None:
    run = make_run(tmp_path / "r", steps=3, meta={"sweep_point": {"trainer.optim.lr": 1e-5}})
    data = load_run(run.root)
    assert data.name == "r" and data.meta["sweep_point"] == {"trainer.optim.lr": 1e-5}
    assert data.config["orchestrator"]["batch_size"] == 16
    assert set(data.metrics["role"]) == {"trainer", "orchestrator"}
    assert len(data.rollouts) == 3 * 16 + 4  # three train steps and one eval at step 0
    assert json.loads(run.run_meta.read_text())["run_id"] == "r0"
    with pytest.raises(FileNotFoundError):
        load_run(tmp_path / "missing")
