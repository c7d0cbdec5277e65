"""The local launcher's progress line: one line per trainer step, from the records appended to metrics.jsonl."""

from __future__ import annotations

import json
from pathlib import Path

from toolkit.launch.local import _Progress


def _append(path: Path, *recs: dict, torn: str = "") -> None:
    with open(path, "a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in recs) + torn)


def test_one_line_per_trainer_step_with_the_newest_reward(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    p = _Progress(path)
    assert p.poll() == []  # no file yet
    _append(
        path,
        {"role": "orchestrator", "step": 1, "reward/all/mean": 0.25},
        {"role": "trainer", "step": 1, "perf/throughput": 812.4, "mismatch_kl/mean": 2e-14},
    )
    assert p.poll() == ["step 1 | reward 0.250 (orch step 1) | 812 tok/s | mismatch_kl 2.0e-14"]
    _append(path, {"role": "orchestrator", "step": 2, "reward/all/mean": 0.5}, torn='{"role": "trainer", "st')
    assert p.poll() == []  # the trainer's step 2 line is still being written: no new trainer step
    with open(path, "a") as f:
        f.write('ep": 2}\n')
    assert p.poll() == ["step 2 | reward 0.500 (orch step 2) | 812 tok/s | mismatch_kl 2.0e-14"]
    assert p.poll() == []


def test_an_sft_run_shows_its_loss(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    _append(path, {"role": "trainer", "step": 3, "loss/mean": 1.23456, "loss/perplexity": 3.4, "val/loss": 1.5})
    assert _Progress(path).poll() == ["step 3 | loss 1.2346 | val/loss 1.5000 (step 3)"]


def test_every_step_gets_its_line_into_a_file_however_the_polls_fall(tmp_path: Path, capsys) -> None:
    """Issue 34 item 6: with stdout a file, steps 3, 6 and 8 of 10 had no line: several steps were recorded between
    two polls and only the newest was shown. Here three polls see 2, 4 and 4 steps."""
    path = tmp_path / "metrics.jsonl"
    p = _Progress(path)

    def steps(*ns: int) -> list[dict]:
        return [
            r
            for n in ns
            for r in (
                {"role": "orchestrator", "step": n, "reward/all/mean": n / 10},
                {"role": "trainer", "step": n, "perf/throughput": 100.0},
            )
        ]

    for batch in ((1, 2), (3, 4, 5, 6), (7, 8, 9, 10)):
        _append(path, *steps(*batch))
        p.show()  # capsys: stdout is not a terminal
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split(" | ")[0] for ln in lines] == [f"step {n}" for n in range(1, 11)]
    assert lines[2] == "step 3 | reward 0.300 (orch step 3) | 100 tok/s"
    p.show()
    assert capsys.readouterr().out == ""  # nothing new: no repeated line
