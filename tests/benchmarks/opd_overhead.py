"""Benchmark: what teacher scoring adds to an RL step: the README job's step time with on-policy distillation over
its step time with GRPO, same batch, measured side by side on this machine.

    python tests/benchmarks/opd_overhead.py              # 12 steps per run, 2 runs of each
    python tests/benchmarks/opd_overhead.py --steps 20 --rounds 3

A teacher (the tiny model, another seed: same tokenizer) is served by ``srl inference`` for the whole benchmark, so
both kinds of run share a machine with one more idle or busy engine. Then ``srl rl @ jobs/reverse-text/rl.toml``
runs ``--steps`` steps as GRPO (64 rollouts per step in groups of 8) and as OPD
(``@ jobs/reverse-text/opd.toml``: 64 rollouts per step, top-20 scoring), alternating, ``--rounds`` times. Figure:
the median orchestrator ``time/step`` over steps 3..N of every run of a kind (the first steps include start-up
effects), and the teacher's mean latency per request. Ratio = OPD / GRPO. Goal: <= 1.3 (one prefill of each
sample, beside the sampling of it). Exits 1 when missed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # run_records: the tests' helpers for srl commands in the background
GOAL = 1.3


def _step_times(run_root: Path, first: int) -> tuple[list[float], list[float]]:
    """(orchestrator time/step of steps >= first, teacher latencies) from the run's metrics.jsonl."""
    times, latency = [], []
    for line in (run_root / "metrics.jsonl").read_text().splitlines():
        m = json.loads(line)
        if m.get("role") == "orchestrator" and m.get("step", 0) >= first and "time/step" in m:
            times.append(m["time/step"])
            latency += [v for k, v in m.items() if k.startswith("teacher/") and k.endswith("/latency_s")]
    return times, latency


def main() -> int:
    from run_records import srl_background, stop_background

    from toolkit.models import build_tiny_model

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--top-k", type=int, default=None, help="algo.top_k of the OPD runs (default: opd.toml's)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="srl-bench-opd-"))
    teacher = build_tiny_model(work / "teacher-model", seed=7)
    serve = srl_background(
        "inference", "@", "jobs/serve/tiny.toml", "--output-dir", str(work), "--run.name", "teacher",
        "--model.name", str(teacher),
    )  # fmt: skip
    try:
        ready = work / "teacher" / "control" / "inference_ready.json"
        deadline = time.monotonic() + 900
        while not ready.exists():
            if serve.poll() is not None or time.monotonic() > deadline:
                print(f"the teacher deployment did not start:\n{serve.stdout.read()[-3000:]}", file=sys.stderr)
                return 1
            time.sleep(0.5)
        kinds = {
            "grpo": ["--orchestrator.batch-size", "64", "--orchestrator.group-size", "8"],
            "opd": ["@", "jobs/reverse-text/opd.toml", "--orchestrator.train.algo.teacher.serve", "false",
                    "--orchestrator.train.algo.teacher.name", str(teacher),
                    "--orchestrator.train.algo.teacher.deployment", str(work / "teacher")],
        }  # fmt: skip
        if args.top_k is not None:
            kinds["opd"] += ["--orchestrator.train.algo.top-k", str(args.top_k)]
        times: dict[str, list[float]] = {k: [] for k in kinds}
        latency: list[float] = []
        for r in range(args.rounds):
            for kind, extra in kinds.items():
                name = f"{kind}-{r}"
                proc = subprocess.run(
                    [sys.executable, "-m", "toolkit.cli", "rl", "@", "jobs/reverse-text/rl.toml", *extra,
                     "--max-steps", str(args.steps), "--output-dir", str(work), "--run.name", name,
                     "--orchestrator.eval.interval", "0", "--orchestrator.eval.env.reverse-text-test.num-examples",
                     "8"],
                    cwd=ROOT, capture_output=True, text=True, check=False,
                )  # fmt: skip
                if proc.returncode != 0:
                    print(f"{name} failed:\n{(proc.stdout + proc.stderr)[-4000:]}", file=sys.stderr)
                    return 1
                t, lat = _step_times(work / name, first=3)
                times[kind] += t
                latency += lat
                print(f"{name}: median time/step {statistics.median(t):.3f} s over {len(t)} steps", flush=True)
    finally:
        stop_background(serve)
    grpo, opd = statistics.median(times["grpo"]), statistics.median(times["opd"])
    ratio = opd / grpo
    print(
        f"[figure] step time with OPD {opd:.3f} s / with GRPO {grpo:.3f} s = {ratio:.2f} "
        f"(median of {len(times['opd'])} / {len(times['grpo'])} steps; teacher latency "
        f"{statistics.mean(latency) if latency else float('nan'):.3f} s per request); goal <= {GOAL}: "
        f"{'met' if ratio <= GOAL else 'MISSED'}"
    )
    return 0 if ratio <= GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
