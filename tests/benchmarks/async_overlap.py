"""Benchmark: how well asynchronous RL overlaps rollout generation with training.

    python tests/benchmarks/async_overlap.py                 # 30 steps per setting on the local CPU job
    python tests/benchmarks/async_overlap.py --steps 40 --warmup 8

The same local job (``srl rl @ jobs/reverse-text/rl.toml``, embedded default: vLLM CPU engine, trainer,
orchestrator on this machine) runs twice, each side on its own core: the rollout side (launcher, engine,
orchestrator, env workers) on core 0 and the trainer on core 1 (the whole run starts under
``taskset --cpu-list 0``; a watcher moves every thread of every process of the run whose environment says
``SRL_ROLE=trainer`` to core 1 as soon as it appears, and keeps doing so for threads started later).

- ``orchestrator.max_async_level = 0``: the orchestrator waits for policy n-1 before generating batch n, so
  generation and training alternate: each side runs alone, on its own core. From its ``metrics.jsonl``, medians
  over the steps after the warm-up: trainer time = the interval between consecutive trainer lines less
  ``time/wait_for_batch`` (train step, weight broadcast, reading and packing the batch); rollout time = the
  interval between consecutive orchestrator step lines less ``time/wait_for_policy`` (collecting the groups, then
  writing the batch, store rows and metrics line), plus the median weight reload (``policy_reloads.jsonl``: the wait
  contains it, and pushing weights into the engine is work of the rollout core that no overlap hides).
- ``max_async_level = 1``: batch n is generated with policy n-2 while the trainer works on batch n-1. Its step time
  is the mean period of the trainer's metrics lines (the two sides settle into alternating short and long
  intervals, so a median would report one of the two modes).

Ratio = async-1 step time / max(trainer alone, rollout alone): 1.0 is perfect overlap (the pipeline runs at the
pace of its slower side), (trainer + rollout) / max(...) is none. Goal: <= 1.15. The ratio against their sum and
the async-0 step time are printed too. Exits 1 when the goal is missed or the machine has fewer than 2 cores.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from toolkit.procutil import descendants

ROOT = Path(__file__).resolve().parents[2]
GOAL = 1.15
ROLLOUT_CORE, TRAINER_CORE = 0, 1


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}  # gone, or not ours to read
    return dict(kv.split("=", 1) for kv in raw.decode(errors="replace").split("\0") if "=" in kv)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _pin_all_threads(pid: int, core: int) -> int:
    """Move every thread of ``pid`` to ``core``; returns how many were moved (0 when all already were)."""
    moved = 0
    try:
        tids = [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()]
    except OSError:
        return 0
    for tid in tids:
        try:
            if os.sched_getaffinity(tid) != {core}:
                os.sched_setaffinity(tid, {core})
                moved += 1
        except OSError:
            continue  # the thread ended meanwhile
    return moved


class TrainerPinner(threading.Thread):
    """Each descendant of the run's launcher (pid ``root``) whose environment says ``SRL_ROLE=trainer`` gets all its
    threads on TRAINER_CORE; everything else of the run stays on the core the run was started on (children
    inherit it).

    The watcher must not cost either side: it looks only at the launcher's descendants
    (:func:`toolkit.procutil.descendants`), reads a descendant's environment again only when its command line
    changed (a fork shows its parent's environment until it execs), and looks every 100 ms only until a trainer is
    pinned, then once a second (threads and processes the trainer starts inherit its core). Reading every
    process's environment 20 times a second took CPU from the two sides it measures."""

    def __init__(self, root: int, run_root: Path) -> None:
        super().__init__(daemon=True)
        self.root, self.run_root, self.stop = root, str(run_root), threading.Event()
        self.pinned: set[int] = set()  # live trainer processes
        self.ever_pinned = 0
        self._looked: dict[int, bytes] = {}  # descendant -> its command line when its environment was read

    def run(self) -> None:
        while not self.stop.wait(1.0 if self.pinned else 0.1):
            self.sweep()

    def sweep(self) -> None:
        """One pass: read the environment of descendants that are new or have exec'd since, then pin."""
        live = descendants(self.root)
        self.pinned &= set(live)  # an ended pid may come back as another process
        self._looked = {pid: cmd for pid, cmd in self._looked.items() if pid in self.pinned or pid in live}
        for pid in live:
            cmdline = _cmdline(pid)
            if pid in self.pinned or self._looked.get(pid) == cmdline:
                continue
            self._looked[pid] = cmdline
            env = _environ(pid)
            if env.get("SRL_ROLE") == "trainer" and env.get("SRL_RUN_DIR") == self.run_root:
                self.pinned.add(pid)
                self.ever_pinned += 1
        for pid in self.pinned:
            _pin_all_threads(pid, TRAINER_CORE)  # threads it started before it was pinned


def run_job(out: Path, async_level: int, steps: int) -> list[dict]:
    """Run the local job to ``steps`` steps with ``max_async_level = async_level``, the rollout side on
    ROLLOUT_CORE and the trainer on TRAINER_CORE; return its metrics lines."""
    name = f"async{async_level}"
    cmd = [
        sys.executable,
        "-m",
        "toolkit.cli",
        "rl",
        "@",
        str(ROOT / "jobs/reverse-text/rl.toml"),
        "--output-dir",
        str(out),
        "--run.name",
        name,
        "--max-steps",
        str(steps),
        "--orchestrator.max-async-level",
        str(async_level),
    ]
    t0 = time.monotonic()
    with open(out / f"{name}.out", "wb") as log:
        proc = subprocess.Popen(  # taskset execs the launcher, so the pid stays the launcher's
            ["taskset", "--cpu-list", str(ROLLOUT_CORE), *cmd],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        pinner = TrainerPinner(proc.pid, (out / name).absolute())
        pinner.start()
        try:
            proc.wait()
        finally:
            pinner.stop.set()
            pinner.join()
    if proc.returncode != 0:
        tail = (out / f"{name}.out").read_text()[-3000:]
        raise SystemExit(f"async level {async_level}: srl rl exited with {proc.returncode}\n{tail}")
    if not pinner.ever_pinned:
        raise SystemExit(f"async level {async_level}: no trainer process of the run was seen to pin")
    print(
        f"  async level {async_level}: {steps} steps, whole run {time.monotonic() - t0:.0f} s; trainer processes "
        f"pinned to core {TRAINER_CORE}: {pinner.ever_pinned}",
        flush=True,
    )
    return [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines() if line.strip()]


def figures(metrics: list[dict], reloads: list[float], warmup: int) -> dict[str, float]:
    """Step, trainer and rollout times (seconds) over the steps after ``warmup``; ``reloads``: the seconds of each
    weight reload of the run (``policy_reloads.jsonl``), in order.

    The step time is the mean period of the trainer's metrics lines (last minus first over their count): at async
    level 1 the two sides settle into a pattern of one short and one long interval, whose median is one of the two
    modes and not the pipeline's rate. Each side's time is its whole cycle less its waits for the other. The
    trainer's: the interval between its metrics lines less its wait for a batch (train step, weight broadcast,
    batch reading and packing). The rollout side's: the interval between the orchestrator's step lines less its
    wait for the policy (collecting the groups, then writing the batch, the store rows and the metrics line, which
    its ``time/step`` stops before), plus the weight reload that the wait contains: pushing the weights into the
    engine, like writing the batch, is rollout-side work on the rollout core, which no overlap can hide."""
    trainer = sorted((m for m in metrics if m["role"] == "trainer" and "time/step" in m), key=lambda m: m["step"])
    # Step lines only: the final policy's eval has a line of its own at the last step, without step times.
    orch = sorted((m for m in metrics if m["role"] == "orchestrator" and "time/step" in m), key=lambda m: m["step"])
    pairs = list(itertools.pairwise(trainer))[warmup:]
    orch_pairs = list(itertools.pairwise(orch))[warmup:]
    kept = trainer[warmup:]
    reload = statistics.median(reloads[warmup:]) if len(reloads) > warmup else 0.0
    return {
        "step": (kept[-1]["time"] - kept[0]["time"]) / (len(kept) - 1),
        "trainer": statistics.median(b["time"] - a["time"] - b.get("time/wait_for_batch", 0.0) for a, b in pairs),
        "rollout": statistics.median(b["time"] - a["time"] - b.get("time/wait_for_policy", 0.0) for a, b in orch_pairs)
        + reload,
        "reload": reload,
        "broadcast": statistics.median(m.get("time/broadcast", 0.0) for m in kept),
        "wait_for_policy": statistics.median(b.get("time/wait_for_policy", 0.0) for _, b in orch_pairs),
    }


def _reload_seconds(run_root: Path) -> list[float]:
    """Seconds of each live weight reload of the run, in order (``policy_reloads.jsonl``)."""
    path = run_root / "policy_reloads.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [float(json.loads(line)["seconds"]) for line in lines if line.strip()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=30, help="trainer steps per setting")
    ap.add_argument("--warmup", type=int, default=5, help="first steps left out of the medians")
    ap.add_argument("--out", type=Path, default=None, help="output directory (default: a temporary one)")
    a = ap.parse_args(argv)
    if a.steps < a.warmup + 5:
        ap.error("--steps must exceed --warmup by at least 5")
    cores = os.sched_getaffinity(0)
    if not {ROLLOUT_CORE, TRAINER_CORE} <= cores:
        print(
            f"async overlap benchmark needs cores {ROLLOUT_CORE} and {TRAINER_CORE}; this process may use "
            f"{sorted(cores)}: not measured",
            file=sys.stderr,
        )
        return 1
    out = a.out or Path(tempfile.mkdtemp(prefix="srl-async-overlap-"))
    out.mkdir(parents=True, exist_ok=True)
    print(
        f"async overlap benchmark: {a.steps} steps per setting, {a.warmup} warm-up, rollout side on core "
        f"{ROLLOUT_CORE}, trainer on core {TRAINER_CORE}; runs under {out}"
    )
    res = {}
    for k in (0, 1):
        metrics = run_job(out, k, a.steps)
        res[k] = figures(metrics, _reload_seconds(out / f"async{k}"), a.warmup)
    print(f"{'async':>5} {'step s':>7} {'trainer s':>9} {'rollout s':>9} {'reload s':>8} {'bcast s':>7} {'wait s':>6}")
    for k, f in res.items():
        print(
            f"{k:>5} {f['step']:7.3f} {f['trainer']:9.3f} {f['rollout']:9.3f} {f['reload']:8.3f} "
            f"{f['broadcast']:7.3f} {f['wait_for_policy']:6.3f}"
        )
    alone, period = res[0], res[1]["step"]
    slower = max(alone["trainer"], alone["rollout"])
    ratio = period / slower
    ok = ratio <= GOAL
    print(
        f"each side alone on its core (async 0): trainer {alone['trainer']:.2f} s, rollout {alone['rollout']:.2f} s; "
        f"no overlap would give {(alone['trainer'] + alone['rollout']) / slower:.2f} x the slower side"
    )
    print(
        f"async 1: step time {period:.2f} s = {ratio:.2f} x max(trainer alone, rollout alone) "
        f"= {period / (alone['trainer'] + alone['rollout']):.2f} x their sum; async 1 / async 0 step time "
        f"{period / alone['step']:.2f}"
    )
    print(f"goal: step time <= {GOAL} x max(trainer alone, rollout alone): {ratio:.2f} -> {'met' if ok else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
