"""Two RL runs on one standalone inference deployment (real vLLM, real runs, nothing faked): the second run that
would load its weights into the engine is refused while the first one lives, naming it; once the first run ends,
the deployment takes the next run."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from run_records import role_steps, srl_background, stop_background

from toolkit import lease
from toolkit.run.layout import RunDir

pytestmark = [pytest.mark.slow, pytest.mark.heavy, pytest.mark.vllm, pytest.mark.timeout(2400)]

REPO = Path(__file__).resolve().parents[2]


def _until(what: str, cond, procs: list[subprocess.Popen], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        for p in procs:
            if p.poll() is not None:
                pytest.fail(f"{p.args[3:5]} exited ({p.returncode}) before {what}:\n{p.stdout.read()[-4000:]}")
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        time.sleep(0.5)


def _owner_run(dep: Path) -> str | None:
    rec = lease.read_policy_owner(RunDir(dep))
    return rec.run if rec is not None else None


def _rl(out: Path, name: str, steps: int, dep: Path) -> list[str]:
    return [
        "rl",
        "@",
        str(REPO / "jobs/reverse-text/rl.toml"),
        "--max-steps",
        str(steps),
        "--output-dir",
        str(out),
        "--run.name",
        name,
        "--inference.external",
        str(dep),
    ]


def test_a_second_full_weight_run_on_one_deployment_is_refused_while_the_first_lives(tmp_path):
    out = tmp_path / "out"
    dep = out / "serve"
    serve = srl_background(
        "inference", "@", str(REPO / "jobs/serve/tiny.toml"), "--output-dir", str(out), "--run.name", "serve"
    )
    a = b = None
    try:
        _until("deployment ready", lambda: RunDir(dep).inference_ready.exists(), [serve], 900)
        a = srl_background(*_rl(out, "a", 200, dep))
        _until(
            "run a trains on the deployment",
            lambda: _owner_run(dep) == str(out / "a") and max(role_steps(out / "a", "trainer"), default=0) >= 1,
            [serve, a],
            900,
        )

        b = subprocess.run(
            [sys.executable, "-m", "toolkit.cli", *_rl(out, "b", 2, dep)],
            cwd=REPO,
            check=False,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert b.returncode == 2, b.stdout + b.stderr
        assert f"already serves the weights of run {out / 'a'}" in b.stderr and f"srl cancel {out / 'a'}" in b.stderr
        assert not (out / "b" / "configs").exists()
        reloads = [json.loads(x) for x in (out / "a" / "policy_reloads.jsonl").read_text().splitlines()]
        assert reloads, "run a loaded no weights into the deployment"

        text = stop_background(a)
        assert a.returncode == 130, text[-3000:]
        assert lease.read_policy_owner(RunDir(dep)) is None  # the owner's orchestrator released it

        b2 = srl_background(*_rl(out, "b", 2, dep))
        text = b2.communicate(timeout=900)[0]
        assert b2.returncode == 0, text[-4000:]
        assert role_steps(out / "b", "trainer") == [1, 2]
    finally:
        for p in (a, serve):
            if p is not None:
                stop_background(p)
