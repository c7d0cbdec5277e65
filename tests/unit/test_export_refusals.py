"""``srl export`` refuses what it cannot export before loading any weights, and its start imports no torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from toolkit.run.layout import COMPLETE_MARKER, RunDir

ROOT = Path(__file__).resolve().parents[2]


def _run_with_checkpoints(root: Path, complete: list[int], incomplete: list[int]) -> RunDir:
    run = RunDir(root)
    run.resolved("rl").parent.mkdir(parents=True)
    run.resolved("rl").write_text("{}")
    for s in complete + incomplete:
        for part in ("trainer", "orchestrator"):
            (run.checkpoint_step(s) / part).mkdir(parents=True)
        if s in complete:
            (run.checkpoint_step(s) / COMPLETE_MARKER).write_text("")
    return run


def test_pick_step_latest_complete_and_refusals(tmp_path):
    from toolkit.trainer.export import ExportError, pick_step

    run = _run_with_checkpoints(tmp_path / "run", complete=[2, 4], incomplete=[6])
    assert pick_step(run, None) == 4  # the incomplete step 6 is newer but not exportable
    assert pick_step(run, 2) == 2
    with pytest.raises(ExportError, match=r"no checkpoint of step 3; complete checkpoints: 2, 4"):
        pick_step(run, 3)
    with pytest.raises(
        ExportError, match=r"step 6 .* incomplete \(missing COMPLETE marker\); complete checkpoints: 2, 4"
    ):
        pick_step(run, 6)
    empty = _run_with_checkpoints(tmp_path / "empty", complete=[], incomplete=[1])
    with pytest.raises(ExportError, match="no complete checkpoint to export"):
        pick_step(empty, None)


def _srl(*args: object) -> subprocess.CompletedProcess:
    probe = (
        "import sys\nfrom toolkit.cli import main\nrc = main(sys.argv[1:])\n"
        "print([m for m in ('torch', 'vllm', 'transformers') if m in sys.modules])\nsys.exit(rc)"
    )
    return subprocess.run(
        [sys.executable, "-c", probe, *map(str, args)],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        timeout=60,
    )


def test_cli_refuses_a_non_empty_target_and_a_missing_run_without_torch(tmp_path):
    run = _run_with_checkpoints(tmp_path / "run", complete=[1], incomplete=[])
    target = tmp_path / "out"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    r = _srl("export", run.root, target)
    assert r.returncode == 2
    assert "is not an empty directory" in r.stderr
    assert r.stdout.strip().splitlines()[-1] == "[]"
    assert (target / "keep.txt").read_text() == "mine"
    r = _srl("export", tmp_path / "nope", tmp_path / "new")
    assert r.returncode == 2 and "no such run directory" in r.stderr
    assert not (tmp_path / "new").exists()


def test_cli_refuses_an_unknown_step_listing_the_complete_ones(tmp_path):
    run = _run_with_checkpoints(tmp_path / "run", complete=[1, 3], incomplete=[])
    r = _srl("export", run.root, "--step", "2", tmp_path / "new")
    assert r.returncode == 2
    assert "no checkpoint of step 2; complete checkpoints: 1, 3" in r.stderr
    assert not (tmp_path / "new").exists()
