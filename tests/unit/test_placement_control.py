"""``srl status``/``cancel``/``logs`` on run directories without a cluster (the cluster path is in
tests/integration/test_rl_sbatch_slurm.py)."""

from __future__ import annotations

from pathlib import Path

from toolkit.launch.control import cancel_main, logs_main, status_main
from toolkit.launch.submit import read_job_ids, record_job_id
from toolkit.rundir import RunDir, point_symlink


def test_no_job_recorded(tmp_path: Path, capsys) -> None:
    assert status_main([str(tmp_path)]) == 1
    assert cancel_main([str(tmp_path)]) == 1
    assert "no Slurm job recorded" in capsys.readouterr().err


def test_job_ids_file_round_trip(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    record_job_id(run, "12", "rl", 1)
    record_job_id(run, "15", "inference", 2)
    assert read_job_ids(run) == [("12", "rl", 1), ("15", "inference", 2)]


def test_logs_by_role(tmp_path: Path, capsys) -> None:
    run = RunDir(tmp_path)
    run.log_attempt(1).mkdir(parents=True)
    point_symlink(run.latest_logs, "attempt_1")
    (run.log_attempt(1) / "trainer.log").write_text("step 1\n")
    (run.log_attempt(1) / "inference-0-0.log").write_text("engine up\n")
    (run.logs / "job-7.out").write_text("batch\n")
    assert logs_main([str(tmp_path), "--role", "trainer"]) == 0
    assert capsys.readouterr().out == "step 1\n"
    assert logs_main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "[job-7.out] batch" in out and "[inference-0-0.log] engine up" in out
