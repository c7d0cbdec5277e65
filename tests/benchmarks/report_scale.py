"""Benchmark: summarise 1,000,000 rollouts from the HDF5 rollout store, against loading the same rows from JSONL.

    .venv/bin/python tests/benchmarks/report_scale.py [--rows 1000000] [--keep DIR]

Writes N rollouts (2 envs, groups of 16, 8192 rollouts per step, one 16-token training sample each) through
``RolloutStoreWriter`` and the same per-rollout columns as JSON lines, then times, in the same run:
  store: ``load_rollouts`` of the columns a report needs + ``step_summary`` + ``env_summary``;
  JSONL: ``pandas.read_json(lines=True)`` of the same rows (the baseline: what a per-rollout log would cost),
         followed by the same summaries.
Prints both times and the ratio JSONL/store. Goal: ratio >= 10 and store path under 10 s.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import pandas as pd

from analysis.store import RolloutStoreWriter, load_rollouts
from analysis.summary import env_summary, group_stats, step_summary
from toolkit.orchestrator.types import Rollout, TrainingSample

REPORT_COLUMNS = [
    "step",
    "kind",
    "env",
    "group_id",
    "reward",
    "error_class",
    "truncated",
    "prompt_len",
    "completion_len",
    "num_turns",
    "off_policy_age",
]
BATCH = 8192  # rollouts per step (one append each): 512 groups of 16
GROUP = 16


def _batch(rng: random.Random, step: int, first_group: int) -> list[Rollout]:
    out = []
    prompt = list(range(8))
    for g in range(BATCH // GROUP):
        env = "arith" if g % 2 else "reverse-text"
        p = rng.random()
        for _ in range(GROUP):
            n = rng.randint(4, 8)
            err = "ProviderError" if rng.random() < 0.01 else None
            reward = float(rng.random() < p)
            out.append(
                Rollout(
                    env=env,
                    task_id=f"{env}-{first_group + g}",
                    example_id=first_group + g,
                    samples=[TrainingSample(prompt, list(range(n)), [True] * n, [-0.5] * n)],
                    reward=reward,
                    reward_components={"correct": reward},
                    num_turns=1,
                    truncated=n == 8,
                    truncation_reason="max_tokens" if n == 8 else None,
                    error_class=err,
                    policy_version=max(step - 1, 0),
                    group_id=first_group + g,
                    timings={"generate": 0.1},
                )
            )
    return out


def _summarise(df: pd.DataFrame) -> tuple[int, float]:
    groups = group_stats(df)
    steps = step_summary(df, groups=groups)
    envs = env_summary(df, groups=groups)
    return len(steps), float(envs["reward_mean"].mean())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--keep", type=Path, default=None, help="directory to keep the files in")
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="srl-report-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    store, jsonl = work / "rollouts.h5", work / "rollouts.jsonl"
    for p in (store, jsonl):
        p.unlink(missing_ok=True)
    rng = random.Random(0)
    t = time.perf_counter()
    rows = 0
    with RolloutStoreWriter(store) as writer:
        step = 0
        while rows < args.rows:
            batch = _batch(rng, step, rows // GROUP)[: args.rows - rows]
            writer.append(batch, step=step)
            rows += len(batch)
            step += 1
    # The same rows as JSON lines, one object per rollout with every scalar column (what a per-rollout log holds).
    everything = load_rollouts(store)
    everything.drop(columns=["error_message"]).to_json(jsonl, orient="records", lines=True)
    del everything
    print(
        f"setup: wrote {rows:,} rollouts ({step} steps) in {time.perf_counter() - t:.1f} s; "
        f"store {store.stat().st_size / 2**20:.0f} MiB, JSONL {jsonl.stat().st_size / 2**20:.0f} MiB"
    )

    # Warm up pandas' groupby paths on a small slice so neither side pays first-call costs.
    _summarise(load_rollouts(store, REPORT_COLUMNS).head(1000))

    t = time.perf_counter()
    df = load_rollouts(store, REPORT_COLUMNS)
    t_load = time.perf_counter() - t
    res_store = _summarise(df)
    t_store = time.perf_counter() - t
    del df

    t = time.perf_counter()
    dj = pd.read_json(jsonl, lines=True)
    t_jload = time.perf_counter() - t
    res_json = _summarise(dj[REPORT_COLUMNS])
    t_json = time.perf_counter() - t
    del dj
    assert res_store[0] == res_json[0] and abs(res_store[1] - res_json[1]) < 1e-9, (res_store, res_json)

    print(f"store: load {t_load:.2f} s, load + summarise {t_store:.2f} s")
    print(f"JSONL (pandas.read_json lines=True): load {t_jload:.2f} s, load + summarise {t_json:.2f} s")
    print(
        f"ratio JSONL/store (load + summarise): {t_json / t_store:.1f}x; load only: {t_jload / t_load:.1f}x"
    )
    ok = t_json / t_store >= 10 and t_store < 10
    print(f"goal (>= 10x and < 10 s): {'met' if ok else 'NOT met'}")
    if args.keep is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
