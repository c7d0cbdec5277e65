"""Benchmark: placement plan + sbatch render time for 1, 16, 128 and 1024 nodes (disaggregated P/D inference).

Run: ``python tests/benchmarks/placement_scale.py``. Prints seconds per node for each size and the ratio against
the 1-node baseline measured in the same run (a ratio near 1 means the cost is linear in nodes). Goal from the
issue: 1024 nodes in under 0.5 s.
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
from toolkit.rundir import RunDir


def layout(nodes: int) -> dict:
    """P/D islands of 4 nodes (3 prefill : 1 decode) on half the nodes, trainer on the rest (1 node: single)."""
    if nodes == 1:
        return {"run": {"name": "bench1"}, "deployment": {"type": "single_node", "gpus_per_node": 8,
                                                          "num_infer_gpus": 4, "num_train_gpus": 4},
                "inference": {"vllm": {"tensor_parallel_size": 2}, "deployment": {"type": "disaggregated"}}}
    islands = max(1, nodes // 8)
    infer = islands * 4
    return {"run": {"name": f"bench{nodes}"},
            "deployment": {"type": "multi_node", "gpus_per_node": 8, "num_train_nodes": nodes - infer,
                           "num_infer_nodes": infer, "num_infer_replicas": islands},
            "inference": {"vllm": {"tensor_parallel_size": 2},
                          "deployment": {"type": "disaggregated", "num_prefill_replicas": 3,
                                         "num_decode_replicas": 1}}}


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
    base = measure(1)
    print(f"{'nodes':>6} {'seconds':>9} {'s/node':>10} {'ratio/node vs 1 node':>22}")
    ok = True
    for n in (1, 16, 128, 1024):
        t = base if n == 1 else measure(n)
        print(f"{n:>6} {t:>9.4f} {t / n:>10.6f} {t / n / base:>22.3f}")
        if n == 1024:
            ok = t < 0.5
            print(f"1024 nodes: {t:.3f} s ({'meets' if ok else 'MISSES'} the 0.5 s goal)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
