"""Trainer-instability evidence that real diverging runs leave: a loss NaN on every step, off-policy KL blow-up."""

from __future__ import annotations

import math

from analysis.diagnose import OFF_POLICY_KL_MAX, diagnose
from toolkit.fsutil import append_jsonl
from toolkit.run.layout import RunDir


def _run(tmp_path, rows):
    run = RunDir(tmp_path / "run")
    run.root.mkdir(parents=True)
    for i, extra in enumerate(rows, 1):
        append_jsonl(run.metrics, {"step": i, "time": 1000.0 + i, "role": "trainer", "optim/grad_norm": 0.1,
                                   **extra})  # fmt: skip
    return run


def test_loss_nan_on_every_step_is_trainer_instability(tmp_path):
    # role_metrics drops all-NaN columns; the loss must survive that to be seen.
    run = _run(tmp_path, [{"loss/mean": math.nan}, {"loss/mean": math.nan}])
    (f,) = diagnose(run)
    assert f.boundary == "trainer instability" and f.evidence["loss_nonfinite_steps"] == 2
    assert f.evidence["first_step"] == 1


def test_off_policy_kl_blow_up_is_trainer_instability(tmp_path):
    rows = [{"loss/mean": 0.01, "off_policy_kl/mean": 0.002}] * 2 + [{"loss/mean": 0.01, "off_policy_kl/mean": 52.5}]
    (f,) = diagnose(_run(tmp_path, rows))
    assert f.boundary == "trainer instability" and f.evidence["first_step"] == 3
    assert f.evidence["off_policy_kl_max"] == 52.5 and f.evidence["off_policy_kl_steps"] == 1


def test_small_off_policy_kl_is_healthy(tmp_path):
    rows = [{"loss/mean": 0.01, "off_policy_kl/mean": OFF_POLICY_KL_MAX / 100}] * 4
    assert diagnose(_run(tmp_path, rows)) == []


def test_skipped_updates_are_trainer_instability(tmp_path):
    # What the trainer records when NaN reaches only the gradient (the loss of IPO-masked tokens stays finite).
    rows = [{"loss/mean": 0.01, "optim/skipped_update": 0.0}] + [{"loss/mean": 0.0, "optim/skipped_update": 1.0}] * 3
    (f,) = diagnose(_run(tmp_path, rows))
    assert f.boundary == "trainer instability" and f.evidence["skipped_updates"] == 3
    assert f.evidence["first_step"] == 2 and "skipped" in f.summary
