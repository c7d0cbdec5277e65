"""Report structure without per-run figures (fast); the full report with figures is in tests/integration."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from analysis_runs import make_run

from analysis.loaders import load_run
from analysis.report import build_report, sweep_table
from toolkit.run import ending
from toolkit.run.layout import RunDir


def test_sections_and_tables_without_figures(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", failure="provider", steps=3)
    ending.settle(RunDir(run.root), failed="orchestrator", failed_reason="exit status 1")
    paths = build_report([run.root], tmp_path / "out", run_figures=False)
    md = paths.markdown.read_text()
    headings = [line for line in md.splitlines() if line.startswith("### ")]
    # The outcome comes first: how the run ended, its steps, eval first -> best -> last, top findings.
    assert headings[0] == "### Outcome"
    outcome = md[md.index("### Outcome") : md.index("### 1.")]
    assert "failed in orchestrator at step 2: exit status 1 (exit status 1)" in outcome
    assert "trainer steps" in outcome and " first -> best -> last " in outcome and "(step 0) ->" in outcome
    assert "Top findings of srl diagnose" in outcome and "ProviderError" in outcome
    assert headings[1:6] == [
        "### 1. Version and resolved config",
        "### 2. Taskset, harness, runtime, renderer, group, batch and eval settings",
        "### 3. Pre-training validation evidence",
        "### 4. Resource and cost envelope",
        "### 5. Monitoring and stop criteria",
    ]
    assert headings[-1] == "### 6. Failures and their boundary"
    assert "ProviderError" in md and "Per-run figures not drawn" in md
    # half of every step errored: [monitors.stop] max_errored_share 0.4 with patience 3 trips at step 2
    assert "tripped at step 2: errored rollouts 50% > 40% for 3 steps" in md
    assert paths.figures == {} and "<img" not in paths.html.read_text()
    steps = pd.read_csv(paths.tables["steps"])
    assert set(steps["env"]) == {"arith", "reverse-text", "all", "arith-test"}
    assert (steps[steps["kind"] == "train"]["errored_rate"] == 0.5).all()


def test_sweep_table_groups_seeds_by_point(tmp_path: Path) -> None:
    runs = [
        load_run(make_run(tmp_path / f"r{i}", steps=2, seed=i, meta={"sweep_point": {"lr": lr, "seed": i}}).root)
        for i, lr in enumerate([1, 1, 2])
    ]
    table, curves = sweep_table(runs, ["reward/all/mean"])
    assert list(table["point"]) == ["lr=1", "lr=2"] and list(table["seeds"]) == [2, 1]
    assert table.loc[1, ["final_low", "final_high"]].isna().all()  # one seed: no interval
    assert len(curves) == 3 * 2


def test_wall_time_counts_from_the_job_start_not_the_first_record(tmp_path: Path) -> None:
    """Engine start-up comes before the first metrics record; the report's wall time (and GPU-hours) include it."""
    import json
    import os

    import pytest

    from analysis.report import _wall_seconds

    run = make_run(tmp_path / "run", steps=3)
    data = load_run(run.root)
    first, last = float(data.metrics["time"].min()), float(data.metrics["time"].max())
    assert _wall_seconds(data) == last - first
    run.launcher.mkdir(exist_ok=True)
    env_file = run.launcher / "job-25.env"  # written by the batch script when the Slurm job starts
    env_file.write_text("SRL_JOB_ID=25\n")
    os.utime(env_file, (first - 90.0, first - 90.0))
    assert _wall_seconds(load_run(run.root)) == pytest.approx(last - first + 90.0, abs=1.0)  # mtime resolution
    (run.launcher / "local.json").write_text(json.dumps({"started": first - 300.0, "ended": last + 5.0}))
    assert _wall_seconds(load_run(run.root)) == last - first + 305.0
