"""Orchestrator overhead: rollouts/s through the whole orchestrator divided by a bare async client's requests/s.

Both run in this one process against the same zero-latency loopback ``/v1/completions`` server
(``tests/loopback_server.py``, its own process), so the server costs nothing and the ratio is the share of the
client-side rate the orchestrator keeps. The orchestrator path is everything a training step does: sampler,
rendering the prompt to token ids, the env worker's episode (setup, the reply, scoring: reverse-text's LCS
reward), the policy client, advantages, filtering, the HDF5 store append, the batch write and the metrics line.
Single-turn rollouts, one completion request each, so a bare request is the fair unit; the bare client sends the
same prompts (the taskset's examples rendered by the same renderer, ~107 tokens each), so both send the same bytes. The
rate counts the rollouts of steps 3..N over the wall time between the metrics lines of step 2 and step N, i.e. whole
steps including their store and batch writes (``time/step`` stops before the writes, so summing it would leave them out;
the next step's groups are generated while they run); steps 1-2 are warm-up (imports, first template render, HDF5 file
creation) and env worker start-up is never counted. The bare client sends as many requests as are counted but at least
8192 (a window of a few seconds: sub-second windows varied by 2x between runs), at the same concurrency
(``--concurrency``, the orchestrator's ``max_concurrent``), after warming its pool.

    python tests/benchmarks/orchestrator_overhead.py [--steps 8] [--batch-size 64] [--group-size 8]
        [--concurrency 64] [--workers 1]

Prints both rates and ``ratio = orchestrator / bare`` (goal >= 0.8), and where the CPU goes: CPU milliseconds per
rollout of this process (the orchestrator's loop and policy client), of its env workers, of its other child
processes (the record writer) and of the server, against the same per bare request, over the same windows (psutil
samples taken when the metrics lines of steps 2 and N appear, polled every 10 ms; no periodic sampling).
On a machine with few cores these sums bound the rates: ``cores * 1000 / ms per rollout`` rollouts/s at most.
Last, the floor of any design: the bare request's CPU plus one reverse-text episode run in this process (no IPC,
no records), and the ratio that floor would allow on this machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Self

import aiohttp
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for loopback_server

from loopback_server import LoopbackServer

from toolkit.config.model import RLConfig
from toolkit.engines.health import write_ready
from toolkit.inference.client import completion_payload
from toolkit.models import resolve_model
from toolkit.orchestrator.main import Orchestrator
from toolkit.run.layout import RunDir
from toolkit.run.types import SamplingParams

# Tiny model's character tokenizer (toolkit/models/tiny.py): 4 specials, "\n", "\t", then chr(c) = 6 + c - 32.
# "cba" then <|im_end|> (id 2). Fixed tokens: the server does no work.
TOKENS = [6 + ord("c") - 32, 6 + ord("b") - 32, 6 + ord("a") - 32, 2]


def reverse_text_tasks() -> list:
    """The reverse-text training tasks as an env worker loads them (its spec with only the taskset id)."""
    from toolkit.envs.registry import load_tasks
    from toolkit.envs.server import taskset_namespace

    return load_tasks(taskset_namespace({"id": "srl-reverse-text"}))


def rendered_prompts(model_dir: Path, n: int) -> list[list[int]]:
    """Token ids of the first ``n`` reverse-text training prompts, rendered as the orchestrator renders them (the
    taskset's first messages through the model's chat template, generation prompt added)."""
    from types import SimpleNamespace

    from toolkit.envs.episode import initial_messages
    from toolkit.models.renderer import load_renderer

    tasks = reverse_text_tasks()
    renderer = load_renderer(SimpleNamespace(name="auto", import_path=None), model_dir)
    return [renderer.render(initial_messages(t.data), add_generation_prompt=True) for t in tasks[:n]]


async def bare_rate(url: str, n: int, concurrency: int, prompts: list[list[int]]) -> float:
    """Requests/s of a plain aiohttp session (the PolicyClient's transport, same connection limit) posting ``n``
    completion requests, cycling through ``prompts``, with ``concurrency`` in flight."""
    bodies = [completion_payload("loopback", p, SamplingParams(max_tokens=16)) for p in prompts]
    sem = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as http:

        async def one(i: int) -> None:
            async with sem, http.post(url + "/v1/completions", json=bodies[i % len(bodies)]) as r:
                await r.json()

        await asyncio.gather(*(one(i) for i in range(min(n, concurrency))))  # warm the connection pool
        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n)))
        return n / (time.perf_counter() - t0)


def episode_cpu_ms(n: int = 4000) -> float:
    """CPU milliseconds of one reverse-text episode run in this process, as an env worker runs it (setup, the
    reply "cba", finalize, scoring; ``sigcache`` installed and the loaded tasks frozen, as in the worker), with no
    IPC: the environment's share of a rollout that no orchestrator design can avoid. Call it last: it replaces
    ``inspect.signature`` in this process (``toolkit.envs.sigcache``)."""
    import gc

    from toolkit.envs import sigcache
    from toolkit.envs.episode import Episode

    tasks = reverse_text_tasks()
    sigcache.install()

    async def one(task) -> None:
        episode = Episode(task)
        await episode.start()
        await episode.step("cba")
        await episode.finalize()
        await episode.score()
        await episode.close()

    async def run(count: int) -> float:
        t0 = time.process_time()
        for i in range(count):
            await one(tasks[i % len(tasks)])
        return time.process_time() - t0

    asyncio.run(run(200))  # warm-up: per-task caches, first scoring
    gc.collect()
    gc.freeze()
    return 1000 * asyncio.run(run(n)) / n


class CpuSampler:
    """CPU seconds (user + system) of this process, the server process and this process's descendants, grouped
    (descendants as ``env workers``, the ``toolkit.envs.server`` processes, and ``other children``: the record
    writer), at the moments ``sample()`` is called. Samples are taken only at window edges (no periodic thread: it
    would perturb the rates it explains); a process that ended keeps its last value and group."""

    GROUPS = ("orchestrator process", "server", "env workers", "other children")

    def __init__(self, server_pid: int) -> None:
        self.me, self.server = psutil.Process(), psutil.Process(server_pid)
        self._last: dict[int, float] = {}
        self._group: dict[int, str] = {self.me.pid: "orchestrator process", server_pid: "server"}

    def _cpu(self, proc: psutil.Process) -> float:
        try:
            t = proc.cpu_times()
            self._last[proc.pid] = t.user + t.system
        except psutil.Error:
            pass
        return self._last.get(proc.pid, 0.0)

    def _group_of(self, proc: psutil.Process) -> str:
        if proc.pid not in self._group:
            try:
                env = "toolkit.envs.server" in " ".join(proc.cmdline())
            except psutil.Error:
                env = False
            self._group[proc.pid] = "env workers" if env else "other children"
        return self._group[proc.pid]

    def sample(self) -> dict[str, float]:
        try:
            children = [p for p in self.me.children(recursive=True) if p.pid != self.server.pid]
        except psutil.Error:
            children = []
        out = dict.fromkeys(self.GROUPS, 0.0)
        for proc in [self.me, self.server, *children]:
            out[self._group_of(proc)] += self._cpu(proc)
        live = {p.pid for p in children} | {self.me.pid, self.server.pid}
        for pid, value in self._last.items():  # ended children keep their last CPU figure
            if pid not in live:
                out[self._group[pid]] += value
        return out


def spent(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    """CPU seconds per group between samples ``a`` and ``b``."""
    return {k: b[k] - a[k] for k in b}


class StepWatcher:
    """Takes ``sampler.sample()`` when the orchestrator's metrics line of each step in ``steps`` appears in
    ``metrics`` (polled every ``period_s`` seconds from a thread: a file size check, nothing else)."""

    def __init__(self, metrics: Path, steps: tuple[int, ...], sampler: CpuSampler, period_s: float = 0.01) -> None:
        import threading

        self.metrics, self.steps, self.sampler, self.period_s = metrics, steps, sampler, period_s
        self.samples: dict[int, dict[str, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        size = 0
        while not self._stop.wait(self.period_s) and len(self.samples) < len(self.steps):
            try:
                now = self.metrics.stat().st_size
            except FileNotFoundError:
                continue
            if now == size:
                continue
            size = now
            sample = self.sampler.sample()
            for line in self.metrics.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:  # a line being written
                    continue
                step = rec.get("step")
                if rec.get("role") == "orchestrator" and step in self.steps and step not in self.samples:
                    self.samples[step] = sample

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def print_cpu(label: str, cpu: dict[str, float], count: int) -> float:
    """Print CPU ms per unit for each group and their sum; returns the sum (ms)."""
    per = {k: 1000 * v / max(count, 1) for k, v in cpu.items()}
    parts = ", ".join(f"{k} {v:.3f}" for k, v in per.items())
    print(f"CPU ms per {label}: {parts}; total {sum(per.values()):.3f}")
    return sum(per.values())


def orchestrator_rate(
    url: str, args: argparse.Namespace, root: Path, sampler: CpuSampler
) -> tuple[float, int, dict[str, float]]:
    """Rollouts/s of the whole orchestrator over steps 3..N (wall time, writes included), the rollouts counted,
    and the CPU seconds per process group between the metrics lines of steps 2 and N."""
    run = RunDir(root / "run")
    cfg = RLConfig.model_validate(
        {
            "max_steps": args.steps,
            "seed": 0,
            # Fixed tokens give every rollout the same reward: no group has signal, which must not stop the run.
            "monitors": {"stop": {"max_empty_steps": None}},
            "orchestrator": {
                "batch_size": args.batch_size,
                "group_size": args.group_size,
                "max_async_level": min(args.steps - 1, 64),
                "max_concurrent": args.concurrency,
                "train": {
                    "sampling": {"max_completion_tokens": 16},
                    "env": [
                        {"name": "rev", "taskset": {"id": "srl-reverse-text"}, "pool": {"max_workers": args.workers}}
                    ],
                },
            },
        }
    )
    write_ready(
        run, {"base_url": url, "router_url": None, "engine_urls": [url], "model": "loopback", "policy_version": 0}
    )
    with StepWatcher(run.metrics, (2, args.steps), sampler) as watch:
        rc = asyncio.run(Orchestrator(cfg, run).run_until_done())
    if rc != 0:
        raise SystemExit(f"orchestrator exited {rc}")
    lines = [json.loads(x) for x in run.metrics.read_text().splitlines()]
    by_step = {x["step"]: x for x in lines if x.get("role") == "orchestrator"}
    counted = [by_step[s] for s in range(3, args.steps + 1)]
    rollouts = sum(int(x["rollouts_offered"]) for x in counted)
    wall = by_step[args.steps]["time"] - by_step[2]["time"]
    return rollouts / wall, rollouts, spent(watch.samples[2], watch.samples[args.steps])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--workers", type=int, default=1, help="env worker processes")
    args = p.parse_args()
    if args.steps < 3:
        p.error("--steps must be >= 3 (steps 1-2 are warm-up)")
    if args.steps > 65:
        # No trainer publishes weights here, so policy 0 is all there is; batch n needs a policy no older than
        # n - 1 - max_async_level, and the config caps max_async_level at 64: step 66 would wait for ever.
        p.error("--steps must be <= 65 (no trainer runs: step 66 would wait for a policy newer than version 0)")
    logging.basicConfig(level=logging.WARNING)
    with LoopbackServer(TOKENS) as srv, tempfile.TemporaryDirectory(prefix="srl-bench-") as tmp:
        n = max(8192, args.batch_size * (args.steps - 2))
        prompts = rendered_prompts(resolve_model(RLConfig().model.name), 256)
        cpu = CpuSampler(srv.proc.pid)
        before = cpu.sample()
        bare_before = asyncio.run(bare_rate(srv.url, n, args.concurrency, prompts))
        bare_cpu = spent(before, cpu.sample())  # includes the pool warm-up: a few dozen requests of thousands
        orch, counted, orch_cpu = orchestrator_rate(srv.url, args, Path(tmp), cpu)
        bare_after = asyncio.run(bare_rate(srv.url, n, args.concurrency, prompts))
    bare = (bare_before + bare_after) / 2  # before and after: machine load drifts during the run
    print(f"bare async client: {bare:.1f} requests/s (before {bare_before:.1f}, after {bare_after:.1f})")
    print(f"orchestrator:      {orch:.1f} rollouts/s ({counted} rollouts, steps 3..{args.steps}, wall time)")
    ok = orch / bare >= 0.8
    print(f"ratio = {orch / bare:.3f} (goal >= 0.8): {'met' if ok else 'NOT met'}")
    cores = len(psutil.Process().cpu_affinity() or []) or psutil.cpu_count()
    bare_ms = print_cpu("bare request", {k: bare_cpu[k] for k in ("orchestrator process", "server")}, n)
    orch_ms = print_cpu("orchestrator rollout", orch_cpu, counted)
    print(
        f"CPU bound on {cores} cores: bare <= {cores * 1000 / bare_ms:.0f} requests/s, orchestrator <= "
        f"{cores * 1000 / orch_ms:.0f} rollouts/s"
    )
    # The floor of any design: a rollout costs at least the bare request (client and server) plus the env's episode.
    floor_ms = bare_ms + episode_cpu_ms()
    print(
        f"floor per rollout: bare request {bare_ms:.3f} + env episode in process {floor_ms - bare_ms:.3f} = "
        f"{floor_ms:.3f} ms CPU: at most {cores * 1000 / floor_ms:.0f} rollouts/s on {cores} cores, ratio <= "
        f"{cores * 1000 / floor_ms / bare:.2f} with no orchestration, IPC or record cost at all"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
