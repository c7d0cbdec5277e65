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
    assert p.poll() is None  # no file yet
    _append(path, {"role": "orchestrator", "step": 1, "reward/all/mean": 0.25},
            {"role": "trainer", "step": 1, "perf/throughput": 812.4, "mismatch_kl/mean": 2e-14})
    assert p.poll() == "step 1 | reward 0.250 (orch step 1) | 812 tok/s | mismatch_kl 2.0e-14"
    _append(path, {"role": "orchestrator", "step": 2, "reward/all/mean": 0.5}, torn='{"role": "trainer", "st')
    assert p.poll() is None  # the trainer's step 2 line is still being written: no new trainer step
    with open(path, "a") as f:
        f.write('ep": 2}\n')
    assert p.poll() == "step 2 | reward 0.500 (orch step 2) | 812 tok/s | mismatch_kl 2.0e-14"
    assert p.poll() is None


def test_an_sft_run_shows_its_loss(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    _append(path, {"role": "trainer", "step": 3, "loss/mean": 1.23456, "loss/perplexity": 3.4, "val/loss": 1.5})
    assert _Progress(path).poll() == "step 3 | loss 1.2346 | val/loss 1.5000 (step 3)"
