"""SIGKILL at random moments during checkpoint saves never leaves a state that resume would pick incomplete.

Each kill point forks a writer from this (already imported) test process: it resumes from whatever
``checkpoints.resume_step`` picks, checks the loaded weights are that step's own, then saves checkpoints in a loop
(trainer part, orchestrator part, COMPLETE, retention) until it is SIGKILLed after a random delay. Forking instead
of starting an interpreter per kill point keeps 30+ kill points to well under a minute (it was ~8 minutes).
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from killpoints import kill_at_random

KILL_POINTS = 32


@pytest.mark.slow
def test_sigkill_during_saves_never_breaks_resume(tmp_path):
    import torch

    from toolkit import checkpoints as ck
    from toolkit.models.tiny import build_tiny_model
    from toolkit.orchestrator.state import load_state, save_state
    from toolkit.run.layout import RunDir
    from toolkit.trainer.checkpoint import load_trainer_state, save_trainer_state
    from toolkit.trainer.model import load_policy
    from toolkit.trainer.optim import build_optimizer, build_scheduler

    torch.set_num_threads(1)  # the forked writer must not need the parent's thread pool
    model_dir = build_tiny_model(tmp_path / "model", seed=0)
    run = RunDir(tmp_path / "run")

    def fresh():
        model = load_policy(model_dir)
        opt = build_optimizer(model, lr=1e-3, weight_decay=0.0, betas=(0.9, 0.99))
        return model, opt, build_scheduler(opt)

    def resume_and_check():
        """What a restarted trainer and orchestrator do; returns the step and the restored objects."""
        model, opt, sched = fresh()
        step = ck.resume_step(run, None)
        if step is None:
            return 0, model, opt, sched
        assert ck.is_complete(run.checkpoint_step(step))
        assert load_trainer_state(ck.part_dir(run, step, "trainer"), model, opt, sched) == step
        assert float(next(model.parameters()).detach().flatten()[0]) == float(step)  # the step's own weights
        assert load_state(run, step)["step"] == step
        return step, model, opt, sched

    def writer() -> None:
        start, model, opt, sched = resume_and_check()
        for step in range(start + 1, start + 100_000):
            with torch.no_grad():
                next(model.parameters()).flatten()[0] = float(step)  # a weight that names its step
            save_trainer_state(run, step, model, opt, sched)
            save_state(run, step, {"sampler": {"pos": step}})  # writes COMPLETE when both parts are there
            if ck.mark_complete_if_ready(run, step):
                ck.apply_retention(run, keep_last=2)

    rng = random.Random(0)
    resumed = []
    for _ in range(KILL_POINTS):
        kill_at_random(writer, rng=rng, max_delay_s=0.5)
        step, *_ = resume_and_check()
        resumed.append(step)
    print(
        f"\n[figure] checkpoint saves: {KILL_POINTS} kill points, {KILL_POINTS} resumes verified, "
        f"newest complete step {resumed[-1]}, complete steps kept {ck.complete_steps(run)}"
    )
    assert resumed[-1] > 0 and resumed == sorted(resumed)  # resume never went backwards
