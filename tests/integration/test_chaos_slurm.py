"""The chaos run (issue 32): seeded faults injected into the main job on the local Slurm cluster (tests/chaos.py
says which faults, what srl must do about each, and the invariants checked at the end).

The 20-fault run is heavy (scripts/test.sh -m heavy, about half an hour); the 5-fault run is its short version and
runs in CI (about 5 minutes).
"""

from __future__ import annotations

import pytest
from chaos import Chaos

pytestmark = [pytest.mark.slow, pytest.mark.slurm, pytest.mark.vllm]


def _chaos(tmp_path, faults: int, seed: int) -> None:
    chaos = Chaos(tmp_path / "out", faults=faults, seed=seed)
    try:
        chaos.run_all()
    finally:
        print("\n" + "\n".join(chaos.log))


@pytest.mark.timeout(7200)
def test_chaos_run_of_5_seeded_faults(tmp_path):
    # Seed 17 draws: requeue, trainer-stop, env-worker-kill, orchestrator-kill, engine-stop (five kinds).
    _chaos(tmp_path, 5, seed=17)


@pytest.mark.heavy
@pytest.mark.timeout(14400)
def test_chaos_run_of_20_seeded_faults(tmp_path):
    _chaos(tmp_path, 20, seed=20)
