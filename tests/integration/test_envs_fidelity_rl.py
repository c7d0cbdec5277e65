"""The outside fixtures (verifiers environments written as published ones are, ``tests/fixtures/vf_envs``) train
for a few steps through ``srl rl`` on real vLLM (CPU build, tiny model): every rollout valid, rewards finite and
recorded, the eval env reading the held-out rows through the taskset's own ``dataset_split``, and the worker's
resolved taskset source in the orchestrator log. About 3 minutes on an idle 2-core machine."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
from prereqs import need_module

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]
need_module("verifiers.v1")

from toolkit.run.layout import RunDir
from toolkit.run.store import load_rollouts

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "vf_envs"


def test_outside_fixtures_train_with_finite_recorded_rewards(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "toolkit.cli",
        "rl",
        "@",
        str(FIXTURES / "rl.toml"),
        "--env-vars.PYTHONPATH",
        str(FIXTURES),
        "--output-dir",
        str(tmp_path),
        "--run.name",
        "fixtures",
    ]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1400, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "taskset 'exec-check' resolves to module exec_check at" in done.stderr  # the dry run's / run's note
    run = RunDir(tmp_path / "fixtures")
    rollouts = load_rollouts(run.rollout_store)
    assert rollouts["error_class"].isna().all(), rollouts["error_message"].dropna().head().tolist()
    assert all(math.isfinite(float(r)) for r in rollouts["reward"])
    kinds = {(str(k), str(e)) for k, e in zip(rollouts["kind"], rollouts["env"], strict=True)}
    assert {("train", "exec-check"), ("train", "tagged-answer"), ("eval", "exec-check-held-out")} <= kinds
    assert rollouts["metric/reply_chars"].notna().any()
    log = (run.root / "logs" / "latest" / "orchestrator.log").read_text()
    assert "env exec-check: taskset exec-check resolved to module exec_check at" in log
