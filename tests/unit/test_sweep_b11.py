"""Field case B11 (array-log-naming): a sweep submitted as one job array names each task's log by array job id +
task index (``%x_%A_%a``), keys each task's run directory by point id (never ``SLURM_JOB_ID``), and the offline
report joins each task's metrics to its point through the manifest.

The submission itself runs against the real cluster in tests/integration/test_sweep_slurm.py; here the rendered
array script (``srl sweep --dry-run``) and the report's join are checked without Slurm.
"""

from __future__ import annotations

import json
from pathlib import Path

from analysis_runs import make_run

from analysis.loaders import load_run
from analysis.report import expand_sweep_dirs, sweep_table
from toolkit.sweep import load_sweep, main, write_manifest

ROOT = Path(__file__).resolve().parents[2]


def _sweep_file(tmp_path: Path) -> Path:
    # The case's trigger: a 3-point learning-rate grid as one array.
    f = tmp_path / "sweep.toml"
    f.write_text(f"""
[sweep]
name = "b11"
base = ["{ROOT}/jobs/reverse-text/rl.toml"]
max_parallel = 2
[sweep.grid]
"trainer.optim.lr" = [1e-6, 3e-6, 1e-5]
[config]
site = "local-slurm"
""")
    return f


def _directives(script: str) -> dict[str, str]:
    out = {}
    for line in script.splitlines():
        if line.startswith("#SBATCH --"):
            key, _, value = line[len("#SBATCH --") :].partition("=")
            out[key] = value
    return out


def test_array_script_names_logs_by_array_job_and_task(tmp_path: Path) -> None:
    assert main(["@", str(_sweep_file(tmp_path)), "--dry-run", "--output-dir", str(tmp_path / "out")]) == 0
    root = tmp_path / "out" / "b11"
    scripts = sorted(root.glob("array_*.sbatch"))
    assert [s.name for s in scripts] == ["array_0.sbatch"]  # one array for the whole sweep
    text = scripts[0].read_text()
    d = _directives(text)
    assert d["array"] == "0-2%2"
    assert d["output"] == d["error"] == f"{root}/logs/%x_%A_%a.out"
    assert d["job-name"] == "b11-sweep-0"  # named after the sweep, not after its first point
    # Each task runs the point of its own index (its own run directory, keyed by point id); nothing in the task's
    # paths uses the per-task job id, which only names the point's batch log.
    assert "srl_points=( p000 p001 p002 )" in text and "${SLURM_ARRAY_TASK_ID:-0}" in text
    assert "%j" not in text and "SLURM_JOB_ID}/" not in text
    manifest = json.loads((root / "manifest.json").read_text())
    assert [(p["index"], p["point_id"], p["params"]["trainer.optim.lr"], p["run_dir"]) for p in manifest["points"]] == [
        (i, f"p{i:03d}", lr, str(root / f"p{i:03d}")) for i, lr in enumerate([1e-6, 3e-6, 1e-5])
    ]


def make_sweep_runs(tmp_path: Path, ran: tuple[int, ...] = (0, 2)) -> Path:
    """A 3-point sweep root with its manifest; only the points in ``ran`` have run directories (with the run meta
    a submission writes, array job 77). Returns the sweep root."""
    sweep = load_sweep(_sweep_file(tmp_path))
    root = tmp_path / "out" / "b11"
    write_manifest(sweep, root)
    for p in (sweep.points[i] for i in ran):
        make_run(
            root / p.point_id,
            steps=2,
            seed=p.index,
            lr=p.params["trainer.optim.lr"],
            meta={
                "sweep": "b11",
                "sweep_point": p.params,
                "seed": p.seed,
                "point_id": p.point_id,
                "sweep_index": p.index,
                "array_job_id": "77",
                "array_task_id": p.index,
            },
        )
    return root


def test_sweep_root_expands_to_its_points_and_joins_metrics_to_points(tmp_path: Path) -> None:
    root = make_sweep_runs(tmp_path)
    # Task 1 has not started, so it has no run directory and is left out.
    dirs = expand_sweep_dirs([root])
    assert dirs == [root / "p000", root / "p002"]
    runs = [load_run(d) for d in dirs]
    assert [(r.meta["array_job_id"], r.meta["array_task_id"]) for r in runs] == [("77", 0), ("77", 2)]
    table, curves = sweep_table(runs, ["reward/all/mean"])
    assert list(table["point"]) == ["trainer.optim.lr=1e-05", "trainer.optim.lr=1e-06"]
    assert dict(zip(curves["run"], curves["point"])) == {
        "p000": "trainer.optim.lr=1e-06",
        "p002": "trainer.optim.lr=1e-05",
    }


def test_plain_run_dirs_pass_through(tmp_path: Path) -> None:
    run = make_run(tmp_path / "r", steps=1)
    assert expand_sweep_dirs([run.root]) == [run.root]
