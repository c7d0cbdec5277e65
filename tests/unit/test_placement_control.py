"""``srl status``/``cancel``/``logs`` on run directories without a cluster (the cluster path is in
tests/integration/test_rl_sbatch_slurm.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolkit.launch.control import cancel_main, logs_main, status_main
from toolkit.launch.submit import read_job_ids, record_job_id
from toolkit.run.layout import RunDir, point_symlink


def test_no_job_recorded(tmp_path: Path, capsys) -> None:
    assert status_main([str(tmp_path)]) == 1
    assert cancel_main([str(tmp_path)]) == 1
    assert "not a run directory" in capsys.readouterr().err
    (tmp_path / "configs").mkdir()
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


def test_status_of_a_local_run_reads_progress_from_the_run_directory(tmp_path: Path, capsys) -> None:
    import json
    import os

    from toolkit.fsutil import append_jsonl, write_marker
    from toolkit.run.launcher import write_local_record

    run = RunDir(tmp_path / "r")
    run.configs.mkdir(parents=True)
    run.launcher.mkdir()
    for step in (1, 2):
        append_jsonl(run.metrics, {"step": step, "time": 0.0, "role": "trainer", "loss/mean": 0.1})
        append_jsonl(run.metrics, {"step": step, "time": 0.0, "role": "orchestrator", "reward/all/mean": 0.25 * step})
    append_jsonl(run.metrics, {"step": 2, "time": 0.0, "role": "orchestrator", "eval/x/avg@4": 0.3})
    run.broadcast_step(2).mkdir(parents=True)
    write_marker(run.broadcast_step(2) / "STABLE")
    write_local_record(run, attempt=1)
    assert status_main([str(run.root)]) == 0
    out = capsys.readouterr().out
    assert f"local launcher pid {os.getpid()}" in out and "running" in out
    assert "trainer: step 2" in out and "orchestrator: step 2, reward 0.5000" in out
    assert "newest complete checkpoint: none" in out and "STABLE): step 2" in out
    run.control.mkdir(parents=True, exist_ok=True)
    write_marker(run.stop_request)
    assert status_main([str(run.root)]) == 0
    assert "stop requested" in capsys.readouterr().out
    from toolkit.run import ending

    ending.settle(run, user_stop=True)  # what the launcher records as it ends
    write_local_record(run, attempt=1, status=130)
    assert json.loads((run.launcher / "local.json").read_text())["status"] == 130
    assert status_main([str(run.root)]) == 0
    out = capsys.readouterr().out
    assert "ended with status 130" in out and "stop requested" not in out  # served
    assert "ended: stopped by the user at step 2 (Ctrl-C or srl cancel) (exit status 130)" in out


BAD_RECORDS = [
    '{"pid": "abc", "host": null, "attempt": 1}',
    '{"pid": true, "host": "h", "attempt": 1}',
    "[1, 2]",
    "not json",
]


@pytest.mark.parametrize("record", BAD_RECORDS)
def test_status_with_a_damaged_launcher_record_and_metrics_file_says_they_are_unreadable(
    tmp_path: Path, capsys, record: str
) -> None:
    run = RunDir(tmp_path / "r")
    run.launcher.mkdir(parents=True)
    run.configs.mkdir()
    run.local_record.write_text(record)
    run.metrics.write_bytes(b'\x00\x01 not a record\n{"step": 1, "ro')
    assert status_main([str(run.root)]) == 0
    out = capsys.readouterr().out
    assert "local launcher: unknown" in out and "pid abc" not in out and "on None" not in out
    assert "no readable metrics" in out and "holds no complete record" in out and "no metrics yet" not in out
    run.metrics.write_text("")  # an empty file is a run that has not recorded anything yet
    assert status_main([str(run.root)]) == 0
    assert "no metrics yet" in capsys.readouterr().out
