"""Torn writes (issue 9 item 3): SIGKILL at random points during rollout-batch writes and weight broadcasts.

Each kill point forks a writer that loops over real ``toolkit.batches.write_batch`` / ``toolkit.trainer.broadcast``
calls (the code the orchestrator and trainer run) and SIGKILLs it after a random delay. After every kill, the
readers the roles use are run over the directory tree: a batch the trainer would read (``read_batch``) or a
broadcast inference would load (``newest_stable_broadcast``) must be whole and carry the data of its own step, and
no ``step_<n>`` directory may exist without its marker. Kill leftovers are counted (proof that kills landed inside
writes) and cleaned the way the roles clean them at start (``remove_stale_temps``).
Checkpoint saves are killed the same way in ``test_trainer_crash.py``.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from killpoints import kill_at_random

from toolkit import batches, fsutil
from toolkit.run.layout import RunDir, numbered_steps
from toolkit.run.types import TrainingSample

pytestmark = pytest.mark.slow

KILLS_PER_WRITER = 25
# How many kills must land inside a write. On a loaded machine more of the random delays end before the child's
# first write, so kill points continue (up to MAX_KILLS) until enough landed; every kill point is checked either way.
MIN_TORN = KILLS_PER_WRITER // 3
MAX_KILLS = 4 * KILLS_PER_WRITER


def _kill_points(torn: int, kills: int) -> bool:
    """Whether to try another kill point: at least KILLS_PER_WRITER, more while too few landed inside a write."""
    return kills < KILLS_PER_WRITER or (torn < MIN_TORN and kills < MAX_KILLS)


def _samples(step: int) -> list[TrainingSample]:
    # ~100k tokens (~1.3 MB of arrays) so a write takes long enough for kills to land inside it; every token id
    # names the step, so a reader that got another step's (or a mixed) file is caught.
    n, p, c = 64, 800, 800
    tok = step % 30000 + 1
    return [TrainingSample([tok] * p, [tok] * c, [True] * c, [-0.5] * c) for _ in range(n)]


def _batch_writer(run: RunDir) -> None:
    step = (max(numbered_steps(run.rollouts), default=0)) + 1
    while True:
        s = _samples(step)
        batches.write_batch(
            run,
            step,
            s,
            [1.0] * len(s),
            policy_versions=[step - 1] * len(s),
            envs=["rev"] * len(s),
            meta={"step": step},
        )
        step += 1


def _leftovers(parent: Path) -> int:
    return sum(1 for e in parent.iterdir() if e.name.startswith(".")) if parent.is_dir() else 0


def test_sigkill_during_batch_writes_never_exposes_a_partial_batch(tmp_path):
    run = RunDir(tmp_path / "run")
    rng = random.Random(1)
    torn = kills = 0
    while _kill_points(torn, kills):
        kills += 1
        kill_at_random(lambda: _batch_writer(run), rng=rng, max_delay_s=0.6)
        steps = numbered_steps(run.rollouts)
        # Every visible step directory is a whole batch, and they are contiguous from 1 (nothing half-renamed).
        assert steps == list(range(1, len(steps) + 1))
        for s in steps[-3:]:
            assert batches.is_ready(run.rollout_step(s)), f"step_{s} visible without READY"
            b = batches.read_batch(run, s, timeout_s=0.0)
            assert b is not None and b.step == s and b.num_samples == 64
            assert set(np.unique(b.input_ids).tolist()) == {s % 30000 + 1}
        # The step being written when the kill came is invisible to the trainer's reader.
        with pytest.raises(TimeoutError):
            batches.read_batch(run, len(steps) + 1, timeout_s=0.0)
        torn += _leftovers(run.rollouts)
        fsutil.remove_stale_temps(run.rollouts)  # what the orchestrator does at start
        assert _leftovers(run.rollouts) == 0
    print(
        f"\n[figure] batch writes: {kills} kill points, {torn} landed inside a write, "
        f"{len(numbered_steps(run.rollouts))} whole batches, 0 partial batches read"
    )
    assert torn >= MIN_TORN, f"only {torn} of {kills} kills landed inside a write: too few to prove anything"


def test_sigkill_during_broadcasts_never_exposes_partial_weights(tmp_path):
    import torch
    from safetensors.torch import load_file

    from toolkit.models.tiny import build_tiny_model
    from toolkit.run.layout import newest_stable_broadcast
    from toolkit.trainer.broadcast import (
        WEIGHTS_FILE,
        apply_broadcast_retention,
        is_stable,
        model_config_dict,
        write_broadcast,
    )
    from toolkit.trainer.model import load_policy

    torch.set_num_threads(1)  # the forked writer must not need the parent's thread pool
    base = build_tiny_model(tmp_path / "base", seed=0)
    model = load_policy(base)
    config = model_config_dict(model)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    first = next(iter(state))
    run = RunDir(tmp_path / "run")
    rng = random.Random(2)

    def writer() -> None:
        newest = newest_stable_broadcast(run)
        # Like a trainer resumed from an older checkpoint: rewrite the newest step, then continue after it.
        step = max(1, newest[0]) if newest else 1
        while True:
            state[first].view(-1)[0] = float(step)  # a weight that names its policy version
            write_broadcast(run, step, state, config, base)
            apply_broadcast_retention(run, keep=2)
            step += 1

    torn = kills = 0
    while _kill_points(torn, kills):
        kills += 1
        kill_at_random(writer, rng=rng, max_delay_s=0.5)
        for s in numbered_steps(run.broadcasts):
            d = run.broadcast_step(s)
            assert is_stable(d), f"{d} visible without STABLE"
        found = newest_stable_broadcast(run)
        if found is not None:  # what a (re)starting engine or the weight updater loads
            step, path = found
            weights = load_file(str(path / WEIGHTS_FILE))
            assert set(weights) == set(state)
            assert float(weights[first].view(-1)[0]) == float(step)
            assert (path / "config.json").is_file() and (path / "tokenizer.json").is_file()
        torn += _leftovers(run.broadcasts)
        fsutil.remove_stale_temps(run.broadcasts)  # what the trainer does at start
    print(
        f"\n[figure] broadcasts: {kills} kill points, {torn} left a torn temp, newest STABLE "
        f"{newest_stable_broadcast(run)[0] if newest_stable_broadcast(run) else None}, 0 partial loads"
    )
    assert newest_stable_broadcast(run) is not None
    assert torn >= MIN_TORN, f"only {torn} of {kills} kills landed inside a write: too few to prove anything"
