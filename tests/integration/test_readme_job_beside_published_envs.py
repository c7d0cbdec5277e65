"""The README's main job runs unchanged with verifiers' published ``reverse-text`` environment (module
``reverse_text``, other config fields) on the job's import path: srl's built-in ids are ``srl-``-prefixed, so the
published id never takes the job over. A 3-step run on real vLLM (CPU build, tiny model), about 2 minutes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from prereqs import need_module

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]
need_module("verifiers.v1")

from toolkit.run.layout import RunDir
from toolkit.run.metrics import TRAINER, recorded_steps

REPO = Path(__file__).resolve().parents[2]
PUBLISHED = REPO / "tests" / "fixtures" / "published_reverse_text"


def test_readme_rl_job_runs_with_published_reverse_text_on_the_path(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "toolkit.cli",
        "rl",
        "@",
        str(REPO / "jobs" / "reverse-text" / "rl.toml"),
        "--env-vars.PYTHONPATH",
        str(PUBLISHED),
        "--max-steps",
        "3",
        "--output-dir",
        str(tmp_path),
        "--run.name",
        "beside-published",
    ]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1100, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run = RunDir(tmp_path / "beside-published")
    log = (run.root / "logs" / "latest" / "orchestrator.log").read_text()
    assert "taskset srl-reverse-text resolved to srl's built-in" in log, log[-2000:]
    assert "module reverse_text" not in log
    assert recorded_steps(run.metrics, TRAINER) == {1, 2, 3}
