"""srl report and srl diagnose on damaged or wrong run directories: a clear message or a finding naming the file,
never a Python traceback, and no report written into a directory that is not a run."""

from __future__ import annotations

from pathlib import Path

import pytest
from analysis_runs import make_run

from analysis import diagnose as diagnose_mod
from analysis import report as report_mod
from analysis.loaders import load_metrics, load_run, read_json


@pytest.fixture(scope="module")
def good_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("runs") / "good"
    make_run(root, steps=3)
    return root


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst, symlinks=True)
    return dst


@pytest.mark.parametrize("main", [diagnose_mod.main, report_mod.main], ids=["diagnose", "report"])
def test_not_a_run_directory_is_refused(main, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    afile = tmp_path / "afile"
    afile.write_text("x")
    for target, words in (
        (empty, "not a run directory"),
        (afile, "not a directory"),
        (tmp_path / "nope", "does not exist"),
    ):
        assert main([str(target)]) == 2
        err = capsys.readouterr().err
        assert words in err and str(target) in err, err
    assert not (empty / "reports").exists(), "a report was written into a directory that is not a run"


def test_garbage_metrics_lines_are_skipped_and_a_directory_in_place_of_the_file_reads_as_missing(
    good_run: Path, tmp_path: Path
) -> None:
    run = _copy(good_run, tmp_path / "r")
    with open(run / "metrics.jsonl", "ab") as f:
        f.write(b"\xdb\xff\x00garbage\n")
    df = load_metrics(run)
    assert df.attrs["skipped_lines"] == 1 and not df.empty
    (run / "metrics.jsonl").unlink()
    (run / "metrics.jsonl").mkdir()
    assert load_metrics(run).empty


def test_binary_json_file_reads_as_empty(tmp_path: Path) -> None:
    p = tmp_path / "run_meta.json"
    p.write_bytes(b"\x9a\x00\xff{")
    assert read_json(p) == {}


@pytest.mark.parametrize("damage", ["binary", "truncated"])
def test_unreadable_store_is_a_finding_not_a_crash(
    damage: str, good_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _copy(good_run, tmp_path / "r")
    store = run / "store" / "rollouts.h5"
    data = store.read_bytes()
    store.write_bytes(b"\x00garbage" * 100 if damage == "binary" else data[:1000])
    loaded = load_run(run)
    assert loaded.rollouts is None and any(str(store) in p for p in loaded.problems)
    findings = diagnose_mod.diagnose(run)
    hit = [f for f in findings if f.boundary == "unreadable run file"]
    assert hit and str(store) in hit[0].summary
    assert diagnose_mod.main([str(run)]) == 1
    assert "unreadable run file" in capsys.readouterr().out
    assert report_mod.main([str(run), "--no-run-figures"]) == 0
    assert "unreadable run file" in (run / "reports" / "report.md").read_text()


def test_binary_resolved_sft_config_does_not_crash_the_report(good_run: Path, tmp_path: Path) -> None:
    run = _copy(good_run, tmp_path / "r")
    (run / "configs" / "attempt_1" / "resolved" / "sft.json").write_bytes(b"\x9a\xff")
    (run / "run_meta.json").write_bytes(b"\x9a\xff")
    assert report_mod.main([str(run), "--no-run-figures"]) == 0


def test_report_out_that_is_a_file_is_refused(good_run: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "out.txt"
    out.write_text("keep")
    assert report_mod.main([str(good_run), "--out", str(out), "--no-run-figures"]) == 2
    err = capsys.readouterr().err
    assert str(out) in err and "--out" in err
    assert out.read_text() == "keep"


def test_sweep_manifest_with_a_bad_index_is_not_a_traceback(good_run: Path, tmp_path: Path, capsys) -> None:
    import json

    root = tmp_path / "sweep"
    root.mkdir()
    points = [{"run_dir": str(good_run), "index": "a"}, {"run_dir": str(good_run), "index": 1}]
    (root / "manifest.json").write_text(json.dumps({"points": points}))
    assert report_mod.main([str(root), "--no-run-figures"]) == 2
    assert "not a run directory" in capsys.readouterr().err
