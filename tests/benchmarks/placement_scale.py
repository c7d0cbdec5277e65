"""Benchmark: placement plan + sbatch render time for 8, 16, 128 and 1024 nodes (disaggregated P/D inference).

Run: ``python tests/benchmarks/placement_scale.py``. Every size has the same layout: P/D islands of 4 nodes
(3 prefill : 1 decode) on half the nodes, the trainer on the other half. Prints seconds and seconds per node for
each size and the per-node ratio against the smallest size of that layout (8 nodes: one island, 4 trainer nodes),
measured in the same run, so the ratio compares like with like (near 1: cost linear in nodes; above 1: it grows
faster than the job). Goals: 1024 nodes in under 0.5 s, and a per-node ratio at 1024 nodes of at most 2.
Exits 1 when a goal is missed.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from golden.layouts import make_cfg

from toolkit.placement import build_plan
from toolkit.preflight.site import load_site
from toolkit.render import build_context, render_text
from toolkit.run.layout import RunDir

SIZES = (8, 16, 128, 1024)
GOAL_1024_S = 0.5
GOAL_RATIO = 2.0


def layout(nodes: int) -> dict:
    """P/D islands of 4 nodes (3 prefill : 1 decode) on half the nodes, the trainer on the rest."""
    islands = max(1, nodes // 8)
    infer = islands * 4
    return {
        "run": {"name": f"bench{nodes}"},
        "deployment": {
            "type": "multi_node",
            "gpus_per_node": 8,
            "num_train_nodes": nodes - infer,
            "num_infer_nodes": infer,
            "num_infer_replicas": islands,
        },
        "inference": {
            "vllm": {"tensor_parallel_size": 2},
            "deployment": {"type": "disaggregated", "num_prefill_replicas": 3, "num_decode_replicas": 1},
        },
    }


def measure(nodes: int, repeats: int = 3) -> float:
    """Best-of-``repeats`` seconds for build_plan + render of one ``nodes``-node job (config validation excluded)."""
    site = load_site("prime-intellect")
    cfg = make_cfg(layout(nodes), site="prime-intellect")
    run = RunDir(Path("/shared/runs") / cfg.run.name)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        plan = build_plan(cfg, site, run, job_id="123456")
        render_text("rl.sbatch.j2", build_context(cfg, site, run, plan, attempt=1), plan)
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> int:
    times = {n: measure(n) for n in SIZES}
    base = times[SIZES[0]] / SIZES[0]
    print(f"{'nodes':>6} {'seconds':>9} {'s/node':>10} {f'ratio/node vs {SIZES[0]} nodes':>22}")
    for n, t in times.items():
        print(f"{n:>6} {t:>9.4f} {t / n:>10.6f} {t / n / base:>22.3f}")
    t, ratio = times[1024], times[1024] / 1024 / base
    ok = t < GOAL_1024_S and ratio <= GOAL_RATIO
    print(
        f"goal: 1024 nodes < {GOAL_1024_S} s and per-node ratio <= {GOAL_RATIO}: {t:.3f} s, ratio {ratio:.2f} "
        f"-> {'met' if ok else 'NOT met'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
