"""Benchmark: cold-start wall time of `srl --help` and of a dry-run, against `python -c pass` in the same run.

Prints each figure in seconds and as a ratio over the bare interpreter start. Goal: a dry-run adds under 1 s.
Run: .venv/bin/python tests/benchmarks/cli_startup.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def wall(argv: list[str], repeat: int) -> float:
    """Median wall seconds of running ``argv`` ``repeat`` times (each a fresh process)."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True, cwd=ROOT)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    py = sys.executable
    base = wall([py, "-c", "pass"], args.repeat)
    help_s = wall([py, "-m", "toolkit.cli", "--help"], args.repeat)
    with tempfile.TemporaryDirectory() as out:
        runs = iter(range(10_000))
        dry = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            subprocess.run(
                [
                    py,
                    "-m",
                    "toolkit.cli",
                    "rl",
                    "@",
                    "jobs/reverse-text/rl.toml",
                    "--dry-run",
                    "--output-dir",
                    out,
                    "--run.name",
                    f"b{next(runs)}",
                ],
                check=True,
                capture_output=True,
                cwd=ROOT,
            )
            dry.append(time.perf_counter() - t0)
        dry_s = statistics.median(dry)
    print(f"python -c pass      : {base:.3f} s (baseline)")
    print(f"srl --help          : {help_s:.3f} s = {help_s / base:.1f}x baseline, +{help_s - base:.3f} s")
    print(
        f"srl rl ... --dry-run: {dry_s:.3f} s = {dry_s / base:.1f}x baseline, +{dry_s - base:.3f} s "
        f"(goal: under +1 s) -> {'PASS' if dry_s - base < 1.0 else 'FAIL'}"
    )
    return 0 if dry_s - base < 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
