"""Benchmark: summarise 1,000,000 rollouts from the HDF5 rollout store, against the best plain-pandas path.

    .venv/bin/python tests/benchmarks/report_scale.py [--rows 1000000] [--keep DIR]

Writes N rollouts (2 envs, groups of 16, 8192 rollouts per step, one 16-token training sample each) through
``RolloutStoreWriter``, and the same per-rollout columns as JSON lines and as Parquet (written by pandas from the
store's own DataFrame, so dtypes match), then times, in the same run, loading the columns a report needs followed
by the same ``step_summary`` + ``env_summary``:
  store:   ``load_rollouts(store, columns)``;
  JSONL:   ``pandas.read_json(lines=True, engine="pyarrow")`` (pandas' fastest JSON reader; it reads every
           column, then the report's are selected);
  Parquet: ``pandas.read_parquet(columns=...)`` (pyarrow; reads only those columns).
The baseline is the faster of JSONL and Parquet. Goals: the store path under 10 s, and at most 1.5x the baseline
(the store also takes appends step by step while a run writes it, which a Parquet file does not). Prints every
time, the ratios, the goal and the verdict; exits 1 when a goal is missed.
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

from analysis.summary import env_summary, group_stats, step_summary
from toolkit.run.store import RolloutStoreWriter, load_rollouts
from toolkit.run.types import Rollout, TrainingSample

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
GOAL_S = 10.0
GOAL_VS_BEST = 1.5
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
    store, jsonl, parquet = work / "rollouts.h5", work / "rollouts.jsonl", work / "rollouts.parquet"
    for p in (store, jsonl, parquet):
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

    # Same rows as Parquet, from the same DataFrame (category columns stay categories).
    everything = load_rollouts(store)
    everything.drop(columns=["error_message"]).to_parquet(parquet, index=False)
    del everything
    print(f"        Parquet {parquet.stat().st_size / 2**20:.0f} MiB")

    # Warm up pandas' groupby paths and each reader on a small slice so no side pays first-call costs.
    _summarise(load_rollouts(store, REPORT_COLUMNS).head(1000))
    pd.read_parquet(parquet, columns=REPORT_COLUMNS).head(1)

    def timed(load) -> tuple[float, float, tuple[int, float]]:
        t = time.perf_counter()
        df = load()
        t_load = time.perf_counter() - t
        res = _summarise(df)
        return t_load, time.perf_counter() - t, res

    paths = {
        "store": lambda: load_rollouts(store, REPORT_COLUMNS),
        "JSONL": lambda: pd.read_json(jsonl, lines=True, engine="pyarrow")[REPORT_COLUMNS],
        "Parquet": lambda: pd.read_parquet(parquet, columns=REPORT_COLUMNS),
    }
    results = {name: timed(load) for name, load in paths.items()}
    for name, (t_load, t_all, res) in results.items():
        print(f"{name:>8}: load {t_load:6.2f} s, load + summarise {t_all:6.2f} s")
        ref = results["store"][2]
        assert res[0] == ref[0] and abs(res[1] - ref[1]) < 1e-9, (name, res, ref)  # same answer from every path
    t_store = results["store"][1]
    best = min(("JSONL", "Parquet"), key=lambda name: results[name][1])
    ratio = t_store / results[best][1]
    print(
        f"store / best plain-pandas path ({best}), load + summarise: {ratio:.2f}x; "
        f"store / JSONL (pyarrow): {t_store / results['JSONL'][1]:.2f}x"
    )
    ok = t_store < GOAL_S and ratio <= GOAL_VS_BEST
    print(
        f"goal (store < {GOAL_S:.0f} s and <= {GOAL_VS_BEST}x the best plain-pandas path): {t_store:.2f} s, "
        f"{ratio:.2f}x -> {'met' if ok else 'NOT met'}"
    )
    if args.keep is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
