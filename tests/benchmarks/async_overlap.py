"""Benchmark: how well asynchronous RL overlaps rollout generation with training (issue 7).

    python tests/benchmarks/async_overlap.py                 # 30 steps per setting on the local CPU job
    python tests/benchmarks/async_overlap.py --steps 40 --warmup 8

The same local job (``srl rl @ jobs/reverse-text/rl.toml``, embedded default: vLLM CPU engine, trainer,
orchestrator on this machine) runs twice in this process's run: with ``orchestrator.max_async_level = 0`` (the
orchestrator waits for policy n-1 before generating batch n: generation and training alternate) and with ``1``
(batch n is generated with policy n-2 while the trainer works on batch n-1). From ``metrics.jsonl``:

- step time: the median interval between consecutive trainer metrics lines (the pipeline's period, seconds);
- trainer time: the median trainer ``time/step`` (forward, backward, optimizer; seconds);
- rollout time: the median orchestrator ``time/step`` minus its ``time/wait_for_policy`` (collecting one batch
  with the engine busy; the wait is time the orchestrator spends idle, not rolling out).

Printed per setting: step time / max(trainer, rollout) (1.0 = perfect overlap) and step time / (trainer + rollout)
(1.0 = no overlap at all). Goal with async level 1: step time <= 1.15 x max(trainer, rollout). Warm-up steps (engine
caches, first broadcast) are left out. Both roles share the machine's cores, so overlapped phases also slow each
other; the per-role figures are measured under that contention, in the same run.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GOAL = 1.15


def run_job(out: Path, async_level: int, steps: int) -> list[dict]:
    """Run the local job to ``steps`` steps with ``max_async_level = async_level``; return its metrics lines."""
    name = f"async{async_level}"
    cmd = [sys.executable, "-m", "toolkit.cli", "rl", "@", str(ROOT / "jobs/reverse-text/rl.toml"),
           "--output-dir", str(out), "--run.name", name, "--max-steps", str(steps),
           "--orchestrator.max-async-level", str(async_level)]
    t0 = time.monotonic()
    with open(out / f"{name}.out", "wb") as log:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0:
        tail = (out / f"{name}.out").read_text()[-3000:]
        raise SystemExit(f"async level {async_level}: srl rl exited with {proc.returncode}\n{tail}")
    print(f"  async level {async_level}: {steps} steps, whole run {time.monotonic() - t0:.0f} s", flush=True)
    return [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines() if line.strip()]


def figures(metrics: list[dict], warmup: int) -> dict[str, float]:
    """Step, trainer and rollout times (seconds, medians over steps after ``warmup``) and the two ratios."""
    trainer = sorted((m for m in metrics if m["role"] == "trainer"), key=lambda m: m["step"])
    orch = [m for m in metrics if m["role"] == "orchestrator" and m["step"] > warmup]
    times = [m["time"] for m in trainer]
    period = statistics.median(b - a for a, b in list(itertools.pairwise(times))[warmup:])
    t_train = statistics.median(m["time/step"] for m in trainer[warmup:])
    t_roll = statistics.median(m["time/step"] - m.get("time/wait_for_policy", 0.0) for m in orch)
    return {
        "step": period, "trainer": t_train, "rollout": t_roll,
        "broadcast": statistics.median(m.get("time/broadcast", 0.0) for m in trainer[warmup:]),
        "wait_for_policy": statistics.median(m.get("time/wait_for_policy", 0.0) for m in orch),
        "vs_max": period / max(t_train, t_roll), "vs_sum": period / (t_train + t_roll),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=30, help="trainer steps per setting")
    ap.add_argument("--warmup", type=int, default=5, help="first steps left out of the medians")
    ap.add_argument("--out", type=Path, default=None, help="output directory (default: a temporary one)")
    a = ap.parse_args(argv)
    if a.steps < a.warmup + 5:
        ap.error("--steps must exceed --warmup by at least 5")
    out = a.out or Path(tempfile.mkdtemp(prefix="srl-async-overlap-"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"async overlap benchmark: {a.steps} steps per setting, {a.warmup} warm-up, runs under {out}")
    res = {k: figures(run_job(out, k, a.steps), a.warmup) for k in (0, 1)}
    print(f"{'async':>5} {'step s':>7} {'trainer s':>9} {'rollout s':>9} {'bcast s':>7} {'wait s':>6} "
          f"{'step/max':>8} {'step/sum':>8}")
    for k, f in res.items():
        print(f"{k:>5} {f['step']:7.2f} {f['trainer']:9.2f} {f['rollout']:9.2f} {f['broadcast']:7.2f} "
              f"{f['wait_for_policy']:6.2f} {f['vs_max']:8.2f} {f['vs_sum']:8.2f}")
    f1 = res[1]
    ok = f1["vs_max"] <= GOAL
    print(f"async 1: step time {f1['step']:.2f} s = {f1['vs_max']:.2f} x max(trainer, rollout) "
          f"(goal <= {GOAL}: {'met' if ok else 'NOT met'}), {f1['vs_sum']:.2f} x their sum; "
          f"async 1 / async 0 step time = {f1['step'] / res[0]['step']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
