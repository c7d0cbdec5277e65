"""Benchmark: rollout throughput of an RL run on the local Slurm cluster with its one engine, then with an elastic
replica job joined, side by side in one run; and a replica job's start to its first served request.

    bash .ci/setup-slurm.sh start                  # the 4-node test cluster on this machine
    python tests/benchmarks/elastic_replicas.py    # 40 steps each way
    python tests/benchmarks/elastic_replicas.py --steps 60

The run is the README's RL job submitted to the cluster (``srl rl @ jobs/reverse-text/rl.toml @
jobs/reverse-text/slurm.toml``) with ``[deployment.elastic]``. After ``--warmup`` steps it measures ``--steps``
orchestrator steps with the run's own engine, then runs ``srl inference join RUN`` and, once the replica joined
(the run's replica events), the next ``--steps`` steps with both engines behind the router. Throughput =
rollouts / second over each window (``effective_batch_size`` over the window's wall time, from the orchestrator's
metrics lines), with the run's weight updates in each window (its reload records: pause-to-resume seconds and
their phases, which show whether the engines were slow to pause or to load). The replica's first served request
is the first time its engine's own generated-token counter (``vllm:generation_tokens_total``) is above zero,
polled every 0.5 s.

Ratio = with the replica / without. Goal: >= 1.3 where each engine has cores of its own. On a 2-core host the
four emulated nodes share the same two cores, so a second engine adds no compute and the ratio says what routing
and a second engine's share of the cores cost, not what a replica gains; the verdict line says so. Exits 1 when the
run fails; a missed goal on such a host is reported, not failed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
GOAL = 1.3


def _wait(what: str, check, timeout_s: float = 900.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.5)
    raise TimeoutError(f"not seen within {timeout_s:g} s: {what}")


def main() -> int:
    import httpx
    from run_records import metrics_lines, srl_run, submit_slurm_rl

    from toolkit.engines.metrics import parse_metric
    from toolkit.launch import slurm
    from toolkit.launch.submit import read_job_ids
    from toolkit.run.control import request_stop

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=40, help="orchestrator steps measured each way")
    ap.add_argument("--warmup", type=int, default=10, help="steps left out before the first window")
    args = ap.parse_args()

    def orch_lines(run) -> list[dict]:
        return [m for m in metrics_lines(run.root) if m.get("role") == "orchestrator" and "effective_batch_size" in m]

    def window(run, first: int) -> tuple[float, float, str]:
        """(rollouts/s, seconds, weight updates) over orchestrator steps first+1 .. first+steps, by the lines' own
        timestamps; the updates are the medians of the run's reload records in the window, phase by phase."""
        lines = {m["step"]: m for m in orch_lines(run)}
        span = [lines[s] for s in range(first, first + args.steps + 1)]
        t0, t1 = span[0]["time"], span[-1]["time"]
        reloads = [r for r in map(json.loads, run.policy_reloads.read_text().splitlines()) if t0 <= r["time"] <= t1]
        phases = {k: statistics.median(r["phases"].get(k, 0.0) for r in reloads) for k in reloads[-1]["phases"]}
        updates = (
            f"{len(reloads)} weight updates, median {statistics.median(r['seconds'] for r in reloads):.3f} s ("
            + (", ".join(f"{k} {v:.3f}" for k, v in phases.items() if v >= 0.001) + ")")
        )
        return sum(m["effective_batch_size"] for m in span[1:]) / (t1 - t0), t1 - t0, updates

    def last_step(run) -> int:
        return max((m["step"] for m in orch_lines(run)), default=0)

    out = Path(tempfile.mkdtemp(prefix="srl-bench-elastic-"))
    run, job = submit_slurm_rl(
        out,
        "elastic",
        "--max-steps",
        "100000",
        "--orchestrator.eval.interval",
        "100000",
        "--deployment.num-train-nodes",
        "1",
        "--deployment.elastic.max-replicas",
        "1",
    )
    replica_jobs: list[str] = []
    try:
        start = args.warmup
        _wait(f"step {start + args.steps}", lambda: last_step(run) >= start + args.steps)
        alone, alone_s, alone_updates = window(run, start)
        srl_run("inference", "join", str(run.root))
        replica_jobs = [j for j, _, _ in read_job_ids(run.replica_run(1))]
        events = run.replica_events

        def joined():
            try:
                return [e for e in map(json.loads, events.read_text().splitlines()) if e["event"] == "join"]
            except OSError:
                return []

        url = _wait("the replica's join", joined)[0]["url"]
        joined_at = joined()[0]["time"]

        def serving() -> float:
            try:
                text = httpx.get(f"{url}/metrics", timeout=30).text
            except httpx.HTTPError:
                return 0.0
            return time.time() if (parse_metric(text, "vllm:generation_tokens_total") or 0) > 0 else 0.0

        first_served = _wait("the replica's first served request", serving)
        started = slurm.job_state(replica_jobs[0]).start_time
        from_start = first_served - started.timestamp() if started else float("nan")
        after = last_step(run)
        _wait(f"step {after + args.steps}", lambda: last_step(run) >= after + args.steps)
        both, both_s, both_updates = window(run, after)
        request_stop(run, "benchmark: measured")
        slurm.wait(job, timeout_s=600, poll_s=2.0)
    finally:
        slurm.cancel(job)
        for j in replica_jobs:
            slurm.cancel(j)

    ratio = both / alone
    cores = os.cpu_count() or 0
    print(
        f"rollouts/s: 1 engine {alone:.1f} ({args.steps} steps, {alone_s:.1f} s); "
        f"with the replica {both:.1f} ({args.steps} steps, {both_s:.1f} s)"
    )
    print(f"1 engine: {alone_updates}\nwith the replica: {both_updates}")
    print(
        f"replica job start -> joined {joined_at - started.timestamp():.1f} s -> first served request "
        f"{from_start:.1f} s"
    )
    if cores <= 2:
        verdict = "not meaningful here: both engines and the trainer share this host's 2 cores"
    else:
        verdict = "PASS" if ratio >= GOAL else "MISS"
    print(f"ratio (2 engines / 1) = {ratio:.2f}; goal >= {GOAL} with cores per engine; verdict: {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
