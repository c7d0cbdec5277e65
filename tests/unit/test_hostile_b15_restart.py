"""Field case B15 (requeue after a node failure restarted from scratch), login-side and resume-choice part.

A Slurm requeue reruns the batch script from the top with the same job id and ``SLURM_RESTART_COUNT=1``, no flag
and no resume pointer written by a checkpoint callback. srl must not depend on how the restart happened: the
trainer's default choice (no ``resume.step``) is the newest complete checkpoint of the run directory, the run id in
``run_meta.json`` survives another attempt, and the batch script appends to its logs and is requeueable. The real
requeue after losing a node runs in ``tests/integration/test_faults_requeue_slurm.py``
(``test_node_down_requeues_and_resumes_each_step_once``).
"""

from __future__ import annotations

import json
from pathlib import Path

from toolkit import checkpoints as ck
from toolkit.config import load_config, load_resolved
from toolkit.launch.prepare import prepare_run
from toolkit.placement import build_plan
from toolkit.preflight.site import load_site
from toolkit.run.layout import RunDir
from toolkit.trainer.main import TrainerSettings, _parse

ROOT = Path(__file__).resolve().parents[2]


def _complete_checkpoint(run, step: int) -> None:
    d = run.checkpoint_step(step)
    for part in ck.PARTS:
        (d / part).mkdir(parents=True, exist_ok=True)
        (d / part / "state.bin").write_bytes(b"x")
    assert ck.mark_complete_if_ready(run, step)


def test_b15_restart_without_flag_resumes_latest_complete_and_keeps_run_id(tmp_path):
    files = [ROOT / "jobs/reverse-text/rl.toml", ROOT / "jobs/reverse-text/slurm.toml"]
    over = ["--output-dir", str(tmp_path), "--run.name", "b15"]
    loaded = load_config(files, over)
    run, first = prepare_run(loaded, argv=over)
    run_id = json.loads(run.run_meta.read_text())["run_id"]
    _complete_checkpoint(run, 10)
    _complete_checkpoint(run, 20)
    (run.checkpoint_step(30) / "trainer").mkdir(parents=True)  # the node died while step 30 was being written

    # The requeued batch script starts the trainer with the same command line, and the trainer reads the attempt's
    # resolved config: both are all it has (nothing in srl reads SLURM_RESTART_COUNT beyond the log line), so
    # its start point must follow from them and the checkpoints alone.
    plan = build_plan(loaded.config, load_site("local-slurm"), run, job_id="1")
    (trainer,) = [p for p in plan.processes if p.role == "trainer"]
    argv = list(trainer.command)
    args = _parse(argv[argv.index("--run-dir") :])
    assert args.resume_step is None and args.resume_dir is None
    settings = TrainerSettings.from_config(load_resolved(RunDir(args.run_dir).resolved("rl")))
    assert settings.resume_step is None and settings.resume_dir is None
    assert ck.resume_step(run, settings.resume_step, ck.parts_of(run)) == 20
    orchestrator = load_resolved(run.resolved("rl"))
    assert ck.resume_step(run, orchestrator.resume.step) == 20

    again, second = prepare_run(load_config(files, over), argv=over, resume=True)
    assert again.root == run.root and second == first + 1
    assert json.loads(run.run_meta.read_text())["run_id"] == run_id


def test_b15_batch_script_is_requeueable_and_appends_logs(tmp_path, capsys):
    from toolkit.cli import main

    out = tmp_path / "out"
    rc = main(
        [
            "rl",
            "@",
            str(ROOT / "jobs/reverse-text/rl.toml"),
            "@",
            str(ROOT / "jobs/reverse-text/slurm.toml"),
            "--output-dir",
            str(out),
            "--run.name",
            "b15",
            "--dry-run",
        ]
    )
    assert rc == 0, capsys.readouterr().err
    script = next(out.rglob("rl.sbatch")).read_text()
    assert "#SBATCH --requeue" in script and "#SBATCH --open-mode=append" in script
