"""SIGKILL at random moments during checkpoint saves never leaves a state that resume would pick incomplete.

Also the file's own worker: ``python test_trainer_crash.py RUN MODEL`` saves checkpoints (trainer part, then
orchestrator part, COMPLETE, retention) in a loop, continuing from whatever resume picks, printing each step.
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _worker(run_root: str, model_dir: str) -> None:
    import torch

    from toolkit import checkpoints as ck
    from toolkit import fsutil
    from toolkit.rundir import RunDir
    from toolkit.trainer.checkpoint import load_trainer_state, save_trainer_state
    from toolkit.trainer.model import load_policy
    from toolkit.trainer.optim import build_optimizer, build_scheduler

    run = RunDir(run_root)
    model = load_policy(model_dir)
    opt = build_optimizer(model, lr=1e-3, weight_decay=0.0, betas=(0.9, 0.99))
    sched = build_scheduler(opt)
    start = ck.resume_step(run, None) or 0
    if start:
        load_trainer_state(ck.part_dir(run, start, "trainer"), model, opt, sched)
        assert float(next(model.parameters()).detach().flatten()[0]) == float(start)  # the step's own weights
    for step in range(start + 1, start + 1000):
        with torch.no_grad():
            next(model.parameters()).flatten()[0] = float(step)  # a weight that names its step
        save_trainer_state(run, step, model, opt, sched)
        with fsutil.atomic_directory(ck.part_dir(run, step, "orchestrator")) as tmp:
            (tmp / "state.json").write_text(str(step))
        if ck.mark_complete_if_ready(run, step):
            ck.apply_retention(run, keep_last=2)
        print(step, flush=True)


@pytest.mark.slow
def test_sigkill_during_saves_never_breaks_resume(tmp_path):
    from toolkit import checkpoints as ck
    from toolkit.models.tiny import build_tiny_model
    from toolkit.rundir import RunDir
    from toolkit.trainer.checkpoint import load_trainer_state
    from toolkit.trainer.model import load_policy
    from toolkit.trainer.optim import build_optimizer, build_scheduler

    model_dir = build_tiny_model(tmp_path / "model", seed=0)
    run = RunDir(tmp_path / "run")
    rng = random.Random(0)
    saves, kills = 0, 0
    while saves < 30:
        proc = subprocess.Popen([sys.executable, __file__, str(run.root), str(model_dir)], cwd=REPO,
                                stdout=subprocess.PIPE, text=True, env={"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
                                                                       "PATH": "/usr/bin:/bin"})
        first = proc.stdout.readline()  # wait until it is saving (imports take seconds)
        assert first.strip(), "worker died before its first save"
        time.sleep(rng.uniform(0.0, 0.3))
        proc.kill()
        rest = proc.stdout.read()
        proc.wait()
        kills += 1
        saves += 1 + len(rest.split())
        step = ck.resume_step(run, None)
        assert step is not None and ck.is_complete(run.checkpoint_step(step))
        model = load_policy(model_dir)
        opt = build_optimizer(model, lr=1e-3, weight_decay=0.0, betas=(0.9, 0.99))
        assert load_trainer_state(ck.part_dir(run, step, "trainer"), model, opt, build_scheduler(opt)) == step
        assert float(next(model.parameters()).detach().flatten()[0]) == float(step)
    assert kills >= 2


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    _worker(sys.argv[1], sys.argv[2])
