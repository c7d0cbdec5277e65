"""Benchmark: srl's steady-state RL step wall time against a minimal in-process loop on the same model and batch.

    python tests/benchmarks/rl_loop.py                      # 40 steps, the README job's RL phase
    python tests/benchmarks/rl_loop.py --steps 50 --warmup 10 [@ overlay.toml ...] [--section.field VALUE ...]

srl: ``srl rl @ jobs/reverse-text/rl.toml @ jobs/reverse-text/rl-after-sft.toml`` (the embedded default: a vLLM
CPU engine, the trainer and the orchestrator on this machine; extra arguments are appended to that command, e.g.
``--model.name`` with an SFT run's directory). Its step wall time is the median interval between consecutive
trainer metrics lines after ``--warmup`` steps: the pace at which the policy learns. The per-phase breakdown comes
from the run's own records: trainer ``time/step`` (forward, backward, optimizer), ``time/broadcast`` (weights
written), ``time/wait_for_batch`` (hand-off from the orchestrator, batch read); orchestrator ``time/step`` and
``time/wait_for_policy``; the engine's pause-to-resume ``seconds`` of ``policy_reloads.jsonl``.

Minimal loop, in this process afterwards, on the run's own resolved config (same model, tasks, batch size, group
size, sampling temperature and token budget, advantages, loss, optimizer, packing at the trainer's row width): each
step samples the batch with the policy itself (HF ``generate`` with a KV cache, one call per group), scores every
completion with the task's own reward, takes group advantages and one ``train_step``, fully on-policy. Its step
time is the median over the same steps. Both get one torch thread (srl's CPU split gives the trainer 1 thread and
the engine a core of its own on a 2-core host; here generation and training share the one).

Ratio = srl / minimal; goal <= 1.5. Exits 1 when it is missed (or the run fails).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GOAL = 1.5
JOB = ["@", "jobs/reverse-text/rl.toml", "@", "jobs/reverse-text/rl-after-sft.toml"]


def run_srl(steps: int, extra: list[str], out: Path) -> Path:
    """Run the job for ``steps`` steps under ``out``; returns its run directory. Raises RuntimeError on failure."""
    cmd = [str(ROOT / ".venv/bin/srl"), "rl", *JOB, *extra, "--max-steps", str(steps), "--output-dir", str(out)]
    print("srl:", " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, check=False, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    runs = [p for p in out.iterdir() if (p / "metrics.jsonl").is_file()]
    if proc.returncode != 0 or not runs:
        raise RuntimeError(f"srl rl exited {proc.returncode}:\n{proc.stdout[-3000:]}")
    return runs[0]


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def srl_phases(run: Path, warmup: int) -> dict[str, float]:
    """Medians (s) over the steps after ``warmup`` of the run's step interval and its recorded phases."""
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    trainer = sorted((x for x in lines if x.get("role") == "trainer"), key=lambda x: x["step"])
    orch = [x for x in lines if x.get("role") != "trainer" and "time/step" in x and x["step"] > warmup]
    steady = [x for x in trainer if x["step"] > warmup]
    gaps = [b["time"] - a["time"] for a, b in itertools.pairwise(trainer) if a["step"] >= warmup]
    # The mean beside the median: a rare long stall (a lost wake-up, a slow reload) hardly moves the median but
    # is paid in every minute of training.
    out = {
        "step wall time (trainer line interval)": _median(gaps),
        "step wall time, mean": statistics.fmean(gaps) if gaps else float("nan"),
    }
    for key in ("time/step", "time/broadcast", "time/wait_for_batch"):
        out[f"trainer {key}"] = _median([x[key] for x in steady if key in x])
    for key in ("time/step", "time/wait_for_policy"):
        out[f"orchestrator {key}"] = _median([x[key] for x in orch if key in x])
    out["orchestrator rollouts (time/step - wait_for_policy)"] = _median(
        [x["time/step"] - x["time/wait_for_policy"] for x in orch]
    )
    reloads = run / "policy_reloads.jsonl"
    if reloads.is_file():
        recs = [json.loads(x) for x in reloads.read_text().splitlines() if x.strip()]
        secs = [r["seconds"] for r in recs if r["version"] > warmup]
        out["engine weight reload (pause to resume)"] = _median(secs)
        out["engine weight reload, longest"] = max(secs, default=float("nan"))
    return out


def minimal_loop(run: Path, steps: int, warmup: int) -> dict[str, float]:
    """The minimal on-policy loop on run ``run``'s resolved config (module docstring); medians (s) of its step and
    its two phases over the steps after ``warmup``."""
    import torch

    from toolkit.batches import samples_to_batch, sampling_meta
    from toolkit.config import load_resolved
    from toolkit.envs.episode import Episode, initial_messages
    from toolkit.envs.registry import load_tasks
    from toolkit.models import resolve_model
    from toolkit.models.renderer import load_renderer
    from toolkit.orchestrator.advantages import group_advantages
    from toolkit.orchestrator.sampler import EnvSampler
    from toolkit.run.layout import RunDir
    from toolkit.run.types import SamplingParams, TrainingSample
    from toolkit.trainer.model import load_policy
    from toolkit.trainer.optim import build_optimizer
    from toolkit.trainer.packing import RowCost, plan_micro_batches
    from toolkit.trainer.step import train_step

    torch.set_num_threads(1)
    cfg = load_resolved(RunDir(run).resolved("rl"))
    o, t = cfg.orchestrator, cfg.trainer
    env = o.train.env[0]
    group = env.group_size or o.group_size
    sampling = o.train.sampling
    tasks = load_tasks(env.taskset)
    model_dir = resolve_model(str(cfg.model.name))
    renderer = load_renderer(o.renderer, model_dir)
    torch.manual_seed(cfg.seed)
    model = load_policy(model_dir, dtype=cfg.model.dtype)
    cost = RowCost.of_model(model)  # packed like srl's trainer packs: rows at the cheapest width
    optimizer = build_optimizer(model, lr=t.optim.lr, weight_decay=t.optim.weight_decay, betas=tuple(t.optim.betas))
    sampler = EnvSampler({"e": list(range(len(tasks)))}, {"e": 1.0}, seed=cfg.seed)
    eos = list(renderer.stop_token_ids)  # the stop tokens the orchestrator's requests carry

    async def reward(task, text: str) -> float:
        ep = Episode(task)
        await ep.start()
        await ep.step(text)
        await ep.finalize()
        scored = await ep.score()
        await ep.close()
        return float(scored["reward"])

    gen_s, train_s, total_s = [], [], []
    loop = asyncio.new_event_loop()
    for n in range(1, steps + 1):
        t0 = time.perf_counter()
        samples, advantages = [], []
        model.eval()
        for _ in range(o.batch_size // group):
            _, example = sampler.draw()
            task = tasks[example]
            prompt = renderer.render(initial_messages(task.data), add_generation_prompt=True)
            ids = torch.tensor([prompt] * group)
            with torch.no_grad():
                g = model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    do_sample=True,
                    temperature=sampling.temperature,
                    top_k=0,
                    top_p=1.0,
                    max_new_tokens=sampling.max_completion_tokens,
                    eos_token_id=eos,
                    pad_token_id=eos[0],
                    output_logits=True,
                    return_dict_in_generate=True,
                )
            new = g.sequences[:, len(prompt) :]
            logp = torch.stack(g.logits, 1).float().div(sampling.temperature).log_softmax(-1)
            logp = logp.gather(-1, new.unsqueeze(-1)).squeeze(-1)
            rewards = []
            for i in range(group):
                toks = new[i].tolist()
                end = next((k + 1 for k, tok in enumerate(toks) if tok in eos), len(toks))
                comp = toks[:end]
                text = renderer.decode([tok for tok in comp if tok not in eos])
                rewards.append(loop.run_until_complete(reward(task, text)))
                samples.append(TrainingSample(prompt, comp, [True] * end, logp[i, :end].tolist()))
            advantages += group_advantages(rewards, o.train.algo.type)
        t1 = time.perf_counter()
        batch = samples_to_batch(
            n,
            samples,
            advantages,
            policy_versions=[n - 1] * len(samples),
            envs=["e"] * len(samples),
            meta={"sampling": sampling_meta(SamplingParams(temperature=sampling.temperature))},
        )
        mbs = plan_micro_batches(batch, seq_len=t.seq_len, micro_batch_size=t.micro_batch_size, cost=cost)
        train_step(
            model, optimizer, None, mbs, loss_cfg=t.loss, max_norm=t.optim.max_norm, num_samples=batch.num_samples
        )
        t2 = time.perf_counter()
        if n > warmup:
            gen_s.append(t1 - t0)
            train_s.append(t2 - t1)
            total_s.append(t2 - t0)
    loop.close()
    return {"step wall time": _median(total_s), "generate + score": _median(gen_s), "train step": _median(train_s)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=8, help="steps left out of the medians (start-up, JIT, caches)")
    args, extra = p.parse_known_args()
    if args.steps <= args.warmup + 2:
        p.error("--steps must exceed --warmup by at least 3")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory(prefix="srl-rl-loop-") as tmp:
        run = run_srl(args.steps, extra, Path(tmp))
        srl = srl_phases(run, args.warmup)
        mini = minimal_loop(run, args.steps, args.warmup)
    print(f"\nsrl (steps {args.warmup + 1}..{args.steps}, medians unless said):")
    for k, v in srl.items():
        print(f"  {k:52s} {v:8.3f} s")
    print("minimal in-process loop (same steps, medians):")
    for k, v in mini.items():
        print(f"  {k:52s} {v:8.3f} s")
    ratio = srl["step wall time (trainer line interval)"] / mini["step wall time"]
    ok = ratio <= GOAL
    print(f"\nratio srl / minimal = {ratio:.2f} (goal <= {GOAL}): {'PASS' if ok else 'MISS'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
