"""A NaN loss never reaches the weights: the real trainer loop skips the update, and stops the run (checkpoint of
the last finite weights, stop request naming the trainer) after ``max_nonfinite_steps`` such steps in a row.

The fault is injected through the batch (NaN advantages from step 2 on): what a diverged or corrupted run feeds the
trainer, without waiting for a real divergence, which the fp32 tiny model does not reach within the allowed lr.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_nonfinite_steps_skip_updates_then_stop_with_a_resumable_checkpoint(tmp_path):
    import json

    import torch

    from toolkit import batches, checkpoints
    from toolkit.config.model import RLConfig
    from toolkit.models.tiny import build_tiny_model
    from toolkit.orchestrator.state import save_state
    from toolkit.run.layout import RunDir
    from toolkit.run.types import TrainingSample
    from toolkit.trainer.checkpoint import load_trainer_state
    from toolkit.trainer.main import TrainerDiverged, TrainerSettings, run_trainer
    from toolkit.trainer.model import load_policy
    from toolkit.trainer.optim import build_optimizer

    torch.set_num_threads(1)
    model_dir = build_tiny_model(tmp_path / "model", seed=0)
    run = RunDir(tmp_path / "run")
    for step in range(1, 7):
        adv = [1.0, -1.0, 0.5, -0.5] if step == 1 else [math.nan] * 4
        samples = [
            TrainingSample([5, 6, 7], [8 + i, 9, 10], [True] * 3, [-4.6] * 3) for i in range(4)
        ]  # near the random model: not IPO-masked
        batches.write_batch(run, step, samples, adv, policy_versions=[step - 1] * 4, envs=["rev"] * 4, meta={})
        save_state(run, step, {"sampler": {}})  # the orchestrator's part, so the trainer's save completes a step
    # The default RL config's settings (what srl rl hands the trainer), with this test's run shape.
    settings = dataclasses.replace(
        TrainerSettings.from_config(RLConfig()),
        model_name=str(model_dir),
        max_steps=6,
        max_nonfinite_steps=3,
        ckpt_interval=None,
        keep_last=2,
        broadcast_keep=2,
        batch_timeout_s=10,
        seq_len=64,
        micro_batch_size=1,
        lr=1e-2,
    )
    with pytest.raises(TrainerDiverged, match=r"not finite for 3 steps in a row \(steps 2-4\)"):
        run_trainer(run, settings)

    lines = [json.loads(x) for x in run.metrics.read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2, 3, 4]  # stopped after the third bad step, not at max_steps
    assert [x["optim/skipped_update"] for x in lines] == [0.0, 1.0, 1.0, 1.0]
    # NaN advantages may leave the reported loss finite (a token IPO masks contributes 0) while NaN still flows
    # back into the gradient: the guard looks at both.
    assert all(not (math.isfinite(x["loss/mean"]) and math.isfinite(x["optim/grad_norm"])) for x in lines[1:])
    assert run.stop_request.read_text().startswith("trainer: loss or gradient not finite")
    # Resume point: step 4 is complete and holds the weights of step 1 (the last finite update), all finite.
    assert checkpoints.resume_step(run, None) == 4
    model = load_policy(model_dir)
    optimizer = build_optimizer(model, lr=1e-2, weight_decay=0.0, betas=(0.9, 0.999))
    load_trainer_state(checkpoints.part_dir(run, 4, "trainer"), model, optimizer, None)
    assert all(torch.isfinite(v).all() for st in optimizer.state.values() for v in st.values() if v.is_floating_point())
    after_step_1 = load_policy(run.broadcast_step(4))  # step 4's broadcast: the same, unchanged weights
    for (name, p), q in zip(model.named_parameters(), after_step_1.parameters(), strict=True):
        assert torch.isfinite(p).all(), name
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    base = load_policy(model_dir)
    assert any(not torch.equal(p, q) for p, q in zip(model.parameters(), base.parameters(), strict=True))
