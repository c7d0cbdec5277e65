"""The main job learns on CPU in a fixed number of steps, and the negative control (no weight updates) does not.

`srl rl @ jobs/reverse-text/rl.toml` is started as a user would with `--max-steps LEARN_STEPS` and runs to its end
(its wall time is printed as a figure; speed is judged by tests/benchmarks, not here). Criterion (issue 7): mean
reward of the last 20 orchestrator steps exceeds the mean of the first 20 by >= 0.05; mismatch_kl (trainer vs
inference on the same weights) stays below 1e-3 on every step it is measured. The same run with
`--no-orchestrator.update-weights` must gain less than 0.02. A learning run below the criterion is repeated once
(see the test for the measured spread); the negative control runs once.

The run is bounded by steps, not by a wall-clock budget: a budget made the verdict depend on how many steps a
loaded machine managed in it.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Measured gains of this job were +0.054..+0.083 after ~125 steps (first 20 vs last 20); 150 leaves a margin.
LEARN_STEPS = 150
RUN_TIMEOUT_S = 1800.0  # only a hung run reaches this; the run ends by itself at LEARN_STEPS

# background_half: scripts/test.sh runs it beside the Slurm tests, to even out the halves' times.
pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.background_half]


def _run(tmp_path: Path, name: str, *extra: str) -> list[dict]:
    cmd = [
        sys.executable,
        "-m",
        "toolkit.cli",
        "rl",
        "@",
        str(ROOT / "jobs/reverse-text/rl.toml"),
        "--output-dir",
        str(tmp_path),
        "--run.name",
        name,
        "--max-steps",
        str(LEARN_STEPS),
        *extra,
    ]
    log = open(tmp_path / f"{name}.out", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    t0 = time.monotonic()
    try:
        proc.wait(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=400)
    finally:
        log.close()
    print(f"{name}: {LEARN_STEPS} steps in {time.monotonic() - t0:.0f} s wall (exit {proc.returncode})")
    assert proc.returncode == 0, (tmp_path / f"{name}.out").read_text()[-3000:]
    return [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]


def _gain(metrics: list[dict]) -> float:
    rewards = [
        m["reward/all/mean"]
        for m in sorted(metrics, key=lambda m: m["step"])
        if m["role"] == "orchestrator" and "reward/all/mean" in m
    ]
    assert len(rewards) == LEARN_STEPS, f"{len(rewards)} orchestrator steps recorded, expected {LEARN_STEPS}"
    first, last = rewards[:20], rewards[-20:]
    gain = sum(last) / 20 - sum(first) / 20
    print(f"{len(rewards)} steps; first-20 mean {sum(first) / 20:.4f}, last-20 mean {sum(last) / 20:.4f}")
    return gain


def test_reverse_text_learns_and_weights_sync(tmp_path):
    metrics = _run(tmp_path, "learn")
    gain = _gain(metrics)
    if gain < 0.05:
        # Measured over runs of this job (8 completion tokens, same seed): gains of +0.054..+0.083 after ~125 steps,
        # because asynchronous timing changes which policy version samples which batch. A single unlucky run is
        # retried once; two runs below the criterion fail. The negative control below stays near 0 every time.
        print(f"first run gained {gain:+.4f}; running the job once more")
        metrics = _run(tmp_path, "learn-again")
        gain = _gain(metrics)
    kls = [m["mismatch_kl/mean"] for m in metrics if m["role"] == "trainer" and "mismatch_kl/mean" in m]
    print(f"gain {gain:+.4f}; mismatch_kl measured on {len(kls)} steps, max {max(kls):.2e}")
    assert gain >= 0.05
    assert kls and max(kls) < 1e-3
    steps = [m["step"] for m in metrics if m["role"] == "trainer"]
    assert len(steps) == len(set(steps)), "each trainer step is recorded exactly once"


# About 5 minutes: with the heavy tests (scripts/test.sh -m heavy), so CI's whole run stays under 60 minutes; the
# learning test above stays in CI.
@pytest.mark.heavy
def test_negative_control_without_weight_updates_does_not_learn(tmp_path):
    metrics = _run(tmp_path, "frozen", "--no-orchestrator.update-weights")
    gain = _gain(metrics)
    print(f"negative control gain {gain:+.4f}")
    assert gain < 0.02
