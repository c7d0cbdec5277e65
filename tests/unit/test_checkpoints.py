"""Checkpoint completeness, resume choice and retention (field cases B16, B17)."""

from __future__ import annotations

import logging

import pytest

from toolkit import checkpoints as ck
from toolkit.run.layout import RunDir


def _make(run: RunDir, step: int, parts=("trainer", "orchestrator"), complete=True):
    d = run.checkpoint_step(step)
    for p in parts:
        (d / p).mkdir(parents=True, exist_ok=True)
        (d / p / "state.bin").write_bytes(b"x")
    d.mkdir(parents=True, exist_ok=True)
    if complete:
        assert ck.mark_complete_if_ready(run, step)
    return d


def test_b16_resume_skips_half_written_newest(tmp_path, caplog):
    run = RunDir(tmp_path / "run1")
    _make(run, 20)
    _make(run, 40, parts=("trainer",), complete=False)  # orchestrator hung before saving
    assert not ck.mark_complete_if_ready(run, 40)
    assert not (run.checkpoint_step(40) / "COMPLETE").exists()
    with caplog.at_level(logging.WARNING):
        assert ck.resume_step(run, None) == 20
    assert "step_40" in caplog.text and "orchestrator/" in caplog.text


def test_b17_no_marker_is_an_error_not_a_fresh_start(tmp_path):
    run = RunDir(tmp_path / "run1")
    _make(run, 30, complete=False)  # both parts, no marker at all
    with pytest.raises(ck.CheckpointError) as e:
        ck.resume_step(run, None)
    msg = str(e.value)
    assert "step_30" in msg and "COMPLETE marker" in msg and "step 0" in msg


def test_fresh_run_has_nothing_to_resume(tmp_path):
    assert ck.resume_step(RunDir(tmp_path / "run1"), None) is None


def test_requested_step_must_be_complete(tmp_path):
    run = RunDir(tmp_path / "run1")
    _make(run, 10)
    _make(run, 20, parts=("trainer",), complete=False)
    assert ck.resume_step(run, 10) == 10
    with pytest.raises(ck.CheckpointError, match="step 20.*orchestrator/"):
        ck.resume_step(run, 20)
    with pytest.raises(ck.CheckpointError, match="step 99"):
        ck.resume_step(run, 99)


def test_marker_without_part_is_not_complete(tmp_path):
    run = RunDir(tmp_path / "run1")
    d = _make(run, 5)
    (d / "orchestrator" / "state.bin").unlink()
    (d / "orchestrator").rmdir()
    assert not ck.is_complete(d)
    assert ck.latest_complete(run) is None


def test_retention_keeps_last_interval_and_in_progress(tmp_path):
    run = RunDir(tmp_path / "run1")
    for s in (1, 2, 3, 4, 5, 6):
        _make(run, s)
    _make(run, 7, parts=("trainer",), complete=False)  # being written now: must survive
    res = ck.apply_retention(run, keep_last=2, keep_interval=3)
    assert sorted(res.deleted) == [1, 2, 4]
    from toolkit.run.layout import numbered_steps

    assert numbered_steps(run.checkpoints) == [3, 5, 6, 7]
    assert ck.apply_retention(run, keep_last=None).deleted == []


def test_retention_never_deletes_newest_complete_and_drops_older_incomplete(tmp_path):
    run = RunDir(tmp_path / "run1")
    _make(run, 1, parts=("trainer",), complete=False)
    _make(run, 2)
    res = ck.apply_retention(run, keep_last=1)
    assert res.deleted == [1]
    assert ck.is_complete(run.checkpoint_step(2))


def test_retention_deletion_failure_is_a_warning(tmp_path, caplog, monkeypatch):
    run = RunDir(tmp_path / "run1")
    _make(run, 1)
    _make(run, 2)

    # Fault injection: a real filesystem here cannot produce NFS's "directory not empty" on demand.
    def boom(path, *a, **k):
        if not k.get("ignore_errors"):
            raise OSError(39, "Directory not empty")

    monkeypatch.setattr(ck.shutil, "rmtree", boom)
    with caplog.at_level(logging.WARNING):
        res = ck.apply_retention(run, keep_last=1)
    assert res.failed == [1] and "could not delete" in caplog.text
    monkeypatch.undo()
    ck.apply_retention(run, keep_last=1)
    assert not list(run.checkpoints.glob(".step_*"))


def test_orchestrator_parts_written_ahead_of_the_first_checkpoint_start_fresh(tmp_path):
    # Killed before the trainer's first save: the orchestrator (ahead by max_async_level) already saved its part.
    run = RunDir(tmp_path / "run1")
    _make(run, 2, parts=("orchestrator",), complete=False)
    assert ck.resume_step(run, None) is None
    _make(run, 4, parts=("trainer",), complete=False)  # a trainer part without COMPLETE is still B17
    with pytest.raises(ck.CheckpointError):
        ck.resume_step(run, None)
