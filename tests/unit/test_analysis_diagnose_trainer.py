"""Trainer-instability evidence that real diverging runs leave: a loss NaN on every step, off-policy KL blow-up."""

from __future__ import annotations

import math
import random
import statistics

from analysis.diagnose import GRAD_NORM_FLOOR, OFF_POLICY_KL_MAX, diagnose
from toolkit.fsutil import append_jsonl, atomic_write_json
from toolkit.run.layout import RunDir, point_symlink


def _run(tmp_path, rows):
    run = RunDir(tmp_path / "run")
    run.root.mkdir(parents=True)
    for i, extra in enumerate(rows, 1):
        append_jsonl(run.metrics, {"step": i, "time": 1000.0 + i, "role": "trainer", "optim/grad_norm": 0.1, **extra})
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


def _grad_run(tmp_path, norms, signal_groups, *, groups=4, max_norm=1.0):
    """A run's metrics as the trainer and orchestrator write them: one grad norm per trainer step, and per
    orchestrator step the groups offered and how many carried signal; the resolved config holds the clip
    threshold."""
    run = RunDir(tmp_path / "run")
    run.root.mkdir(parents=True)
    if max_norm is not None:
        run.resolved("rl", attempt=1).parent.mkdir(parents=True)
        atomic_write_json(run.resolved("rl", attempt=1), {"trainer": {"optim": {"lr": 1e-3, "max_norm": max_norm}}})
        point_symlink(run.latest_configs, "attempt_1")
    for i, (norm, signal) in enumerate(zip(norms, signal_groups, strict=True), 1):
        append_jsonl(
            run.metrics,
            {
                "step": i,
                "time": 1000.0 + i,
                "role": "orchestrator",
                "filter/groups_offered": float(groups),
                "filter/signal_groups": float(signal),
            },
        )
        append_jsonl(
            run.metrics, {"step": i, "time": 1000.5 + i, "role": "trainer", "loss/mean": 0.001, "optim/grad_norm": norm}
        )
    return run


def _readme_like_norms(n=60, seed=0):
    """Norms of an RL run after SFT: most steps have no group with signal (norm near zero), a few have one or two
    (norms up to about half the clip threshold): 29 steps were >10x their recent median, max 0.53."""
    rng = random.Random(seed)
    signal = [rng.choice([0, 0, 0, 0, 0, 1, 1, 2]) for _ in range(n)]
    norms = [0.002 + 0.001 * rng.random() if s == 0 else 0.25 * s * (0.8 + 0.25 * rng.random()) for s in signal]
    return norms, signal


def test_small_grad_norms_of_a_low_signal_run_are_healthy(tmp_path):
    norms, signal = _readme_like_norms()
    run = _grad_run(tmp_path, norms, signal)
    old_rule = [n for i, n in enumerate(norms) if i >= 3 and n > 10 * statistics.median(norms[max(0, i - 10) : i])]
    assert len(old_rule) >= 5 and max(norms) < 1.0  # what the relative test alone called spikes
    assert diagnose(run) == []


def test_unstable_grad_norms_are_an_error(tmp_path):
    norms = [0.3 + 0.02 * (i % 3) for i in range(20)]
    norms[12], norms[16] = 45.0, math.inf
    (f,) = diagnose(_grad_run(tmp_path, norms, [3] * 20))
    assert f.boundary == "trainer instability" and f.severity == "error"
    assert f.evidence["grad_norm_spikes"] == 2 and f.evidence["first_step"] == 13
    assert f.evidence["grad_norm_scale"] == 1.0 and f.evidence["signal_group_share"] == 0.75


def test_moderate_spike_above_the_clip_threshold_is_a_warning(tmp_path):
    norms = [0.3] * 10 + [4.0] + [0.3] * 5
    (f,) = diagnose(_grad_run(tmp_path, norms, [4] * 16))
    assert f.severity == "warning" and f.evidence["grad_norm_max"] == 4.0 and "above 1" in f.summary


def test_spike_scale_is_the_floor_or_a_tighter_clip(tmp_path):
    # Clipping off (max_norm 1e9, as the diverging-trainer run sets it) keeps the floor: a jump to 45 is an error.
    norms = [0.3] * 10 + [45.0] + [0.3] * 5
    (f,) = diagnose(_grad_run(tmp_path / "a", norms, [4] * 16, max_norm=1e9))
    assert f.severity == "error" and f.evidence["grad_norm_scale"] == GRAD_NORM_FLOOR
    # A clip at 0.05 makes 0.05 the scale: a 20x jump to 0.6 counts, and at over 10x the scale it is an error.
    small = [0.03] * 10 + [0.6] + [0.03] * 5
    (g,) = diagnose(_grad_run(tmp_path / "b", small, [4] * 16, max_norm=0.05))
    assert g.evidence["grad_norm_scale"] == 0.05 and g.severity == "error"
    # The same norms with the default clip of 1.0 are below the floor: healthy.
    assert diagnose(_grad_run(tmp_path / "c", small, [4] * 16, max_norm=1.0)) == []
    # Without a configured clip threshold the scale is the floor.
    (h,) = diagnose(_grad_run(tmp_path / "d", norms, [4] * 16, max_norm=None))
    assert h.evidence["grad_norm_scale"] == GRAD_NORM_FLOOR


def test_a_full_signal_step_after_low_signal_ones_is_no_spike(tmp_path):
    # Norm 3 at a step where every group carries signal, after steps with one group in 16: 30x the median norm,
    # but per unit of signal the same gradient; above the clip threshold, so only the signal share explains it.
    norms = [0.1] * 10 + [3.0] + [0.1] * 4
    signal = [1] * 10 + [16] + [1] * 4
    assert diagnose(_grad_run(tmp_path, norms, signal, groups=16)) == []
