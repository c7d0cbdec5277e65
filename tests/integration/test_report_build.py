"""srl report on run directories written the way a run writes them: sections, figures, tables, sweeps."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytestmark = pytest.mark.slow  # matplotlib renders ~10-20 figures: seconds, more on a loaded machine

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))

from analysis_runs import make_run

from analysis.loaders import load_metrics, role_metrics
from analysis.report import build_report, main
from analysis.summary import t_interval

SECTIONS = [
    "1. Version and resolved config",
    "2. Taskset, harness, runtime, renderer, group, batch and eval settings",
    "3. Pre-training validation evidence",
    "4. Resource and cost envelope",
    "5. Monitoring and stop criteria",
    "6. Failures and their boundary",
]


def test_single_run_report(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", failure="task", steps=6)
    paths = build_report([run.root], tmp_path / "out")
    page = paths.html.read_text()
    md = paths.markdown.read_text()
    for title in SECTIONS:
        assert f"<h3>{title}</h3>" in page
        assert f"### {title}" in md
    # every figure is embedded in the HTML and referenced from the Markdown twin
    imgs = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(imgs) == len(paths.figures) >= 8
    assert {
        "reward",
        "effective_batch_size",
        "errors_truncation",
        "lengths_turns",
        "off_policy_age",
        "mismatch_kl",
        "entropy_loss_grad",
        "throughput_waits",
        "eval",
    } <= set(paths.figures)
    for name, png in paths.figures.items():
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"![{name}](figures/{name}.png)" in md
    # resolved config, settings, step-0 baseline, envelope, diagnosis
    assert "eval/arith-test/avg@2" in md and "Baseline eval at step 0" in md
    assert "GPU-hours" in md and "1 node(s) x 2 GPU(s)" in md
    assert "TaskError" in md and "retries do not fix it" in md
    assert '"max_errored_share": 0.4' in md
    envs = pd.read_csv(paths.tables["envs"])
    assert set(envs["env"]) == {"arith", "reverse-text", "arith-test"}
    errors = pd.read_csv(paths.tables["errors"])
    assert set(errors["error_class"]) == {"TaskError"}


def test_report_of_run_without_store_or_config(tmp_path: Path) -> None:
    (tmp_path / "bare" / "logs").mkdir(parents=True)  # a run that has only just started: nothing recorded yet
    paths = build_report([tmp_path / "bare"], tmp_path / "out")
    md = paths.markdown.read_text()
    assert "No baseline eval recorded" in md and "No rollouts or metrics recorded yet" in md
    assert paths.figures == {}
    with pytest.raises(FileNotFoundError):
        build_report([tmp_path / "missing"], tmp_path / "out2")
    (tmp_path / "empty").mkdir()  # no run file at all: a wrong path, not a run
    with pytest.raises(FileNotFoundError, match="is not a run directory"):
        build_report([tmp_path / "empty"], tmp_path / "out3")


def test_sweep_report_table_with_intervals(tmp_path: Path) -> None:
    runs = []
    for lr in (1e-5, 1e-4):
        for seed in range(3):
            runs.append(
                make_run(
                    tmp_path / f"lr{lr}_s{seed}",
                    steps=5,
                    seed=seed,
                    lr=lr,
                    meta={"sweep_point": {"trainer.optim.lr": lr, "seed": seed}, "array_task_id": len(runs)},
                ).root
            )
    out = tmp_path / "sweep_report"
    assert main([str(r) for r in runs] + ["--out", str(out), "--no-run-figures"]) == 0
    table = pd.read_csv(out / "tables" / "sweep.csv")
    rew = table[table["metric"] == "reward/all/mean"].set_index("point")
    assert list(rew.index) == ["trainer.optim.lr=0.0001", "trainer.optim.lr=1e-05"]
    assert (rew["seeds"] == 3).all()
    # the interval matches a t-interval of each seed's last logged value
    finals = [role_metrics(load_metrics(r), "orchestrator")["reward/all/mean"].iloc[-1] for r in runs[:3]]
    mean, low, high = t_interval(np.array(finals))
    got = rew.loc["trainer.optim.lr=1e-05"]
    assert (got["final_mean"], got["final_low"], got["final_high"]) == pytest.approx((mean, low, high))
    assert got["best_mean"] >= got["final_mean"]
    assert {"eval/arith-test/avg@2", "eval/arith-test/pass@2"} <= set(table["metric"])
    assert (out / "figures" / "sweep_reward_all_mean.png").exists()
    runs_table = pd.read_csv(out / "tables" / "sweep_runs.csv")
    assert sorted(runs_table["array_index"]) == list(range(6))
    md = (out / "report.md").read_text()
    assert md.count("## Run ") == 6 and "## Sweep" in md
    assert {p.name for p in (out / "figures").iterdir()} == {  # the held-out scores, then the train reward
        "sweep_reward_all_mean.png",
        "sweep_eval_arith-test_avg_2.png",
        "sweep_eval_arith-test_pass_2.png",
    }
