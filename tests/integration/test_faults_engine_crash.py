"""kill -9 of the vLLM engine during a local run of the main job (issue 9 item 2, inference side).

1. Default (``inference.max_restarts`` > 0): the launcher restarts the engine with the same command and port; the
   orchestrator holds generation meanwhile, loads the newest STABLE broadcast into the restarted engine, and the
   run completes ``max_steps`` with status 0, every trainer and orchestrator step in ``metrics.jsonl`` exactly
   once, the restarted engine reporting the restored version (``policy_reloads.jsonl``, ``"restore": true``).
2. ``inference.max_restarts = 0``: the engine's death ends the run at once, non-zero, naming the engine, and
   ``--resume`` continues without losing or repeating a step.

Heavy (two CPU vLLM start-ups each, several minutes): run by hand.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_records import served_version
from test_faults_local_resume import REPO, START_TIMEOUT_S, _finish, _steps, _wait_trainer_step

pytestmark = [pytest.mark.slow, pytest.mark.heavy, pytest.mark.vllm, pytest.mark.timeout(3000)]
MAX_STEPS = 6


def _start(out: Path, *extra: str, resume: bool = False) -> subprocess.Popen:
    argv = [
        sys.executable,
        "-m",
        "toolkit.cli",
        "rl",
        "@",
        str(REPO / "jobs/reverse-text/rl.toml"),
        "--max-steps",
        str(MAX_STEPS),
        "--ckpt.interval",
        "2",
        "--output-dir",
        str(out),
        "--run.name",
        "faults",
        *extra,
    ]
    if resume:
        argv.append("--resume")
    return subprocess.Popen(
        argv,
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _engine_pid(run: Path) -> tuple[str, int]:
    plan = json.loads((run / "launcher" / "placement.json").read_text())
    spec = next(p for p in plan["processes"] if p["role"] == "inference")
    port = str(spec["ports"]["http"])
    for d in sorted((d for d in Path("/proc").iterdir() if d.name.isdigit()), key=lambda d: int(d.name)):
        try:
            argv = (d / "cmdline").read_bytes().decode().split("\0")
        except OSError:
            continue
        if "vllm.entrypoints.openai.api_server" in argv and argv[argv.index("--port") + 1] == port:
            return spec["name"], int(d.name)
    raise AssertionError("no engine process found")


def _newest_stable(run: Path) -> int:
    steps = [int(p.parent.name[5:]) for p in (run / "broadcasts").glob("step_*/STABLE")]
    return max(steps, default=0)


def _exactly_once(run: Path) -> None:
    for role in ("trainer", "orchestrator"):
        steps = [s for s in _steps(run, role) if s > 0]
        assert sorted(steps) == list(range(1, MAX_STEPS + 1)), (role, steps)  # none lost, none twice


def test_engine_kill_is_survived_by_a_restart_with_the_newest_stable_weights(tmp_path):
    out = tmp_path / "out"
    run = out / "faults"
    proc = _start(out)
    _wait_trainer_step(proc, run, 2, START_TIMEOUT_S)
    time.sleep(random.Random(3).uniform(0.0, 3.0))
    name, pid = _engine_pid(run)
    stable_at_kill = _newest_stable(run)
    os.kill(pid, signal.SIGKILL)
    killed_at = time.time()
    rc, text = _finish(proc, START_TIMEOUT_S + 1200)
    assert rc == 0, text
    assert f"{name} exited with status -9; restarting it (restart 1 of" in text, text
    assert f"{name} healthy again" in text, text
    _exactly_once(run)
    reloads = [json.loads(line) for line in (run / "policy_reloads.jsonl").read_text().splitlines()]
    restores = [r for r in reloads if r.get("restore")]
    assert len(restores) == 1, reloads
    r = restores[0]
    # The restored version is the newest STABLE one when it was loaded, and the restarted engine reports it.
    assert r["version"] >= max(stable_at_kill, 1), (r, stable_at_kill)
    assert r["time"] > killed_at
    assert set(r["engines"].values()) == {served_version(run, r["version"])}, r
    newer = [x for x in reloads if x["time"] < r["time"] and x["version"] > r["version"]]
    assert not newer, "a restore must never go back to an older version"
    orch = next((run / "logs" / "attempt_1").glob("orchestrator*.log")).read_text()
    back = [ln for ln in orch.splitlines() if "inference back after" in ln]
    assert back, orch[-3000:]
    outage_s = float(back[0].split("inference back after ")[1].split(" s")[0])
    print(
        f"\n[figure] engine kill -9 -> restored version {r['version']} (newest STABLE at kill {stable_at_kill}) "
        f"after {outage_s:.1f} s of held generation, reload {r['seconds']:.2f} s; run completed {MAX_STEPS} "
        "steps, 0 lost, 0 repeated"
    )


def test_engine_kill_without_restarts_ends_run_naming_it_and_resume_loses_no_step(tmp_path):
    out = tmp_path / "out"
    run = out / "faults"
    proc = _start(out, "--inference.max-restarts", "0")
    _wait_trainer_step(proc, run, 1, START_TIMEOUT_S)
    time.sleep(random.Random(3).uniform(0.0, 3.0))
    name, pid = _engine_pid(run)
    os.kill(pid, signal.SIGKILL)
    t0 = time.monotonic()
    rc, text = _finish(proc, 120)
    took = time.monotonic() - t0
    assert rc != 0 and f"{name} exited with status -9" in text, text
    assert "restarting it" not in text
    assert took < 60
    proc = _start(out, "--inference.max-restarts", "0", resume=True)
    rc, text = _finish(proc, START_TIMEOUT_S + 600)
    assert rc == 0, text
    _exactly_once(run)
    print(
        f"\n[figure] engine kill -9 (max_restarts 0) -> launcher exit in {took:.1f} s; resumed to step {MAX_STEPS}, "
        "0 steps lost"
    )
