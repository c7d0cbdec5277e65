"""Learning check: srl's tool-use RL (code-lookup) against a minimal multi-turn loop from the same start.

    python tests/benchmarks/tool_rl_reference.py SRL_RUN [--steps 50] [--lr 2e-5] [--eval-every 25] [--greedy]

``SRL_RUN`` is a finished ``srl rl`` run of a code-lookup job (``jobs/code-lookup/rl-after-sft.toml`` after the
SFT warm-up). The minimal loop runs in this process on that run's resolved config: the same starting model, train
and held-out keys, prompts and tool schemas (``toolkit.envs.reference.reference_rows``: the messages and schemas
verifiers' chat program sends), Hermes renderer, group and batch size, sampling temperature, token budgets
(``max_completion_tokens`` per turn, ``max_turns``, ``max_total_tokens``), advantages, loss and optimizer.
Each episode: the policy samples a turn (HF ``generate`` with a KV cache); a well-formed tool call is answered by
the taskset's own tool server (its MCP registration, called in this process) and the tool's reply is appended as
the renderer's continuation tokens (masked out of the loss, as in srl's trace samples); a turn without a call ends
the episode and its text, stripped, is the reply, scored 1.0 when it is the key's code. Each step trains once on
the batch it sampled (fully on-policy; srl runs one step off-policy). Evals use the held-out keys with the run's
eval group size, seeded per eval point so two points draw alike (paired comparison over the same keys).

Printed: the reference's held-out avg@k with its standard error at each eval point and the paired gain from step
0 (mean of per-key differences +- its standard error), the train reward per block of steps, its step wall time;
beside them srl's own eval readings and train rewards from ``SRL_RUN``'s metrics. ``--greedy`` adds the greedy
(temperature 0) accuracy at the first and last point: what sharpening the sampling distribution could reach.
The verdict compares the two gains at the last common eval step: srl's gain must not fall short of the
reference's by more than two standard errors of the difference (exit 1 when it does).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


class ToolServers:
    """The taskset's tool servers registered in this process (nothing started): call a tool by its chat name."""

    def __init__(self, taskset: Any, task: Any) -> None:
        from toolkit.envs.reference import registered_tools

        self.tools: dict[str, tuple[Any, str]] = {
            name: (mcp, tool.name) for name, mcp, tool in registered_tools(taskset, task)
        }

    def call(self, name: str, arguments: str) -> str:
        """The tool's reply text; an unknown tool or arguments that are not a JSON object give an error text, as
        the chat program sends back to the model."""
        if name not in self.tools:
            return f"Error: unknown tool {name!r}"
        try:
            args = json.loads(arguments)
        except json.JSONDecodeError as e:
            return f"Error: the arguments are not JSON ({e})"
        if not isinstance(args, dict):
            return "Error: the arguments are not a JSON object"
        mcp, tool = self.tools[name]
        try:
            result = asyncio.run(mcp.call_tool(tool, args))
        except Exception as e:  # noqa: BLE001 - the tool's failure is the episode's tool reply, not the loop's crash
            return f"Error: {e}"
        content = result.content if hasattr(result, "content") else result[0]
        return "".join(getattr(c, "text", "") for c in content)


class Loop:
    """The minimal loop's model, renderer, tools and settings, from ``run``'s resolved config."""

    def __init__(self, run: Path, lr: float | None) -> None:
        import torch

        from toolkit.config import load_resolved
        from toolkit.envs.reference import reference_rows
        from toolkit.envs.registry import load_selected
        from toolkit.models import resolve_model
        from toolkit.models.renderer import load_renderer
        from toolkit.run.layout import RunDir
        from toolkit.trainer.model import load_policy
        from toolkit.trainer.optim import build_optimizer
        from toolkit.trainer.packing import RowCost

        torch.set_num_threads(1)
        self.cfg = cfg = load_resolved(RunDir(run).resolved("rl"))
        o, t = cfg.orchestrator, cfg.trainer
        self.env, self.eval_env = o.train.env[0], o.eval.env[0]
        self.group = self.env.group_size or o.group_size
        self.groups_per_step = o.batch_size // self.group
        self.sampling = self.env.sampling or o.train.sampling
        self.eval_sampling = self.eval_env.sampling or getattr(o.eval, "sampling", None) or self.sampling
        self.train_rows = reference_rows(self.env.taskset)
        self.eval_rows = reference_rows(self.eval_env.taskset)[: self.eval_env.num_examples]
        taskset, tasks = load_selected(self.env.taskset)
        self.tools = ToolServers(taskset, tasks[0])
        model_dir = resolve_model(str(cfg.model.name))
        self.renderer = load_renderer(o.renderer, model_dir)
        self.stop = set(self.renderer.stop_token_ids)
        torch.manual_seed(cfg.seed)
        self.model = load_policy(model_dir, dtype=cfg.model.dtype)
        self.cost = RowCost.of_model(self.model)
        self.lr = lr if lr is not None else t.optim.lr
        self.optimizer = build_optimizer(
            self.model, lr=self.lr, weight_decay=t.optim.weight_decay, betas=tuple(t.optim.betas)
        )

    def _generate(
        self, prompts: list[list[int]], temperature: float, budget: int
    ) -> list[tuple[list[int], list[float]]]:
        """One sampled turn per prompt: (completion ids, stop token included when sampled; their logprobs)."""
        import torch

        out: list[tuple[list[int], list[float]] | None] = [None] * len(prompts)
        by_len: dict[int, list[int]] = {}
        for i, p in enumerate(prompts):
            by_len.setdefault(len(p), []).append(i)  # equal lengths share one call: no padding to get wrong
        for idx in by_len.values():
            ids = torch.tensor([prompts[i] for i in idx])
            sample = temperature > 0
            with torch.no_grad():
                g = self.model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    do_sample=sample,
                    temperature=temperature if sample else None,
                    top_k=0 if sample else None,
                    top_p=1.0 if sample else None,
                    max_new_tokens=budget,
                    eos_token_id=sorted(self.stop),
                    pad_token_id=min(self.stop),
                    output_logits=True,
                    return_dict_in_generate=True,
                )
            new = g.sequences[:, ids.shape[1] :]
            logits = torch.stack(g.logits, 1).float()
            logp = (logits / temperature if sample else logits).log_softmax(-1)
            logp = logp.gather(-1, new.unsqueeze(-1)).squeeze(-1)
            for row, i in enumerate(idx):
                toks = new[row].tolist()
                end = next((k + 1 for k, tok in enumerate(toks) if tok in self.stop), len(toks))
                out[i] = (toks[:end], logp[row, :end].tolist())
        return [o for o in out if o is not None]

    def episodes(self, row: dict, k: int, temperature: float) -> list[dict]:
        """``k`` episodes of one task: each a dict of prompt ids, completion ids, mask, logprobs, reward,
        looked_up_key."""
        from toolkit.models.renderer import parse_tool_calls

        env = self.env
        answer = row["completion"][-1]["content"]
        tools = row.get("tools")
        base = self.renderer.render(row["prompt"], tools=tools)
        eps = [
            {"prompt": base, "comp": [], "mask": [], "lp": [], "history": list(row["prompt"]), "reply": None,
             "looked": 0.0, "done": False}
            for _ in range(k)
        ]  # fmt: skip
        for _turn in range(env.max_turns):
            live = [e for e in eps if not e["done"]]
            budgets = [
                min(self.sampling.max_completion_tokens, env.max_total_tokens - len(base) - len(e["comp"]))
                for e in live
            ]
            for e, b in zip(live, budgets, strict=True):
                if b <= 0:
                    e["done"] = True  # the episode's token budget is spent: truncated, no reply
            live = [e for e, b in zip(live, budgets, strict=True) if b > 0]
            if not live:
                break
            budget = min(b for b in budgets if b > 0)
            turns = self._generate([e["prompt"] + e["comp"] for e in live], temperature, budget)
            for e, (ids, lps) in zip(live, turns, strict=True):
                e["comp"] += ids
                e["mask"] += [True] * len(ids)
                e["lp"] += lps
                text = self.renderer.decode([t for t in ids if t not in self.stop])
                content, calls = parse_tool_calls(text)
                if not calls or not ids or ids[-1] not in self.stop:
                    e["reply"], e["done"] = (content if ids and ids[-1] in self.stop else None), True
                    continue
                assistant = {
                    "role": "assistant",
                    "content": content,
                    "tool_calls": [{"id": f"call_{j}", "type": "function", "function": c} for j, c in enumerate(calls)],
                }
                replies = [self.tools.call(c["name"], c["arguments"]) for c in calls]
                e["looked"] = max(e["looked"], float(answer in replies))
                tail = [{"role": "tool", "tool_call_id": f"call_{j}", "content": r} for j, r in enumerate(replies)]
                cont = self.renderer.continuation(e["history"] + [assistant], tail, completion_ids=ids, tools=tools)
                if cont is None:
                    raise RuntimeError("the renderer cannot continue this conversation by appending tokens")
                e["history"] += [assistant, *tail]
                e["comp"] += cont
                e["mask"] += [False] * len(cont)
                e["lp"] += [0.0] * len(cont)
        for e in eps:
            e["reward"] = float(e["reply"] is not None and e["reply"].strip() == answer)
        return eps

    def train_step(self, step: int, rng: Any) -> tuple[float, float]:
        """Sample one batch from the train keys and train on it; returns (mean reward, seconds)."""
        from toolkit.batches import samples_to_batch, sampling_meta
        from toolkit.orchestrator.advantages import group_advantages
        from toolkit.run.types import SamplingParams, TrainingSample
        from toolkit.trainer.packing import plan_micro_batches
        from toolkit.trainer.step import train_step

        t0 = time.perf_counter()
        self.model.eval()
        samples, advantages, rewards = [], [], []
        for _ in range(self.groups_per_step):
            row = self.train_rows[rng.randrange(len(self.train_rows))]
            eps = self.episodes(row, self.group, self.sampling.temperature)
            rs = [e["reward"] for e in eps]
            rewards += rs
            advantages += group_advantages(rs, self.cfg.orchestrator.train.algo.type)
            samples += [TrainingSample(e["prompt"], e["comp"], e["mask"], e["lp"]) for e in eps]
        batch = samples_to_batch(
            step,
            samples,
            advantages,
            policy_versions=[step - 1] * len(samples),
            envs=["e"] * len(samples),
            meta={"sampling": sampling_meta(SamplingParams(temperature=self.sampling.temperature))},
        )
        t = self.cfg.trainer
        mbs = plan_micro_batches(batch, seq_len=t.seq_len, micro_batch_size=t.micro_batch_size, cost=self.cost)
        self.model.train()
        train_step(
            self.model, self.optimizer, None, mbs, loss_cfg=t.loss, max_norm=t.optim.max_norm,
            num_samples=batch.num_samples,
        )  # fmt: skip
        return statistics.fmean(rewards), time.perf_counter() - t0

    def evaluate(self, seed: int, *, greedy: bool = False) -> list[float]:
        """Per held-out key, the mean reward of its samples (the eval group size; one greedy sample with
        ``greedy``), drawn under ``seed``."""
        import torch

        torch.manual_seed(seed)
        self.model.eval()
        k = 1 if greedy else (self.eval_env.group_size or self.group)
        temperature = 0.0 if greedy else self.eval_sampling.temperature
        return [statistics.fmean(e["reward"] for e in self.episodes(r, k, temperature)) for r in self.eval_rows]


def mean_se(xs: list[float]) -> tuple[float, float]:
    """Mean and its standard error (sample standard deviation / sqrt(n))."""
    return statistics.fmean(xs), (statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else float("nan"))


def srl_records(run: Path) -> tuple[dict[int, tuple[float, float]], dict[int, float], float]:
    """srl's held-out readings {step: (avg@k, stderr)}, train reward per step, and median trainer line interval."""
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    evals: dict[int, tuple[float, float]] = {}
    for m in lines:
        for key, v in m.items():
            if key.startswith("eval/") and "/avg@" in key and not key.endswith("/stderr"):
                evals[m["step"]] = (v, m.get(key + "/stderr", float("nan")))
    train = {m["step"]: m["reward/all/mean"] for m in lines if "reward/all/mean" in m}
    times = sorted(m["time"] for m in lines if m.get("role") == "trainer")
    gaps = [b - a for a, b in itertools.pairwise(times)]
    return evals, train, statistics.median(gaps) if gaps else float("nan")


def main() -> int:
    import random

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("run", type=Path, help="a finished srl rl run of a code-lookup job")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--lr", type=float, default=None, help="default: the run's trainer.optim.lr")
    p.add_argument("--eval-every", type=int, default=25)
    p.add_argument("--greedy", action="store_true", help="also the greedy accuracy at the first and last point")
    p.add_argument("--eval-keys", type=int, default=None, help="held-out keys per eval (default: the run's eval)")
    args = p.parse_args()
    loop = Loop(args.run, args.lr)
    loop.eval_rows = loop.eval_rows[: args.eval_keys]
    print(f"reference loop: {len(loop.train_rows)} train keys, {len(loop.eval_rows)} held-out keys, lr {loop.lr:g}, "
          f"{loop.groups_per_step} groups of {loop.group} per step", flush=True)  # fmt: skip
    points = sorted({0, *range(args.eval_every, args.steps + 1, args.eval_every), args.steps})
    seed = loop.cfg.seed + 1234
    readings: dict[int, list[float]] = {}
    greedy: dict[int, float] = {}
    rng = random.Random(loop.cfg.seed)
    rewards: list[float] = []
    step_s: list[float] = []
    for step in range(args.steps + 1):
        if step in points:
            readings[step] = loop.evaluate(seed)
            m, se = mean_se(readings[step])
            line = f"step {step}: held-out avg {m:.3f} +- {se:.3f}"
            if step:
                d = [a - b for a, b in zip(readings[step], readings[0], strict=True)]
                dm, dse = mean_se(d)
                line += f"; paired gain {dm:+.3f} +- {dse:.3f}"
            if args.greedy and step in (0, args.steps):
                greedy[step] = statistics.fmean(loop.evaluate(seed, greedy=True))
                line += f"; greedy {greedy[step]:.3f}"
            print(line, flush=True)
        if step == args.steps:
            break
        r, s = loop.train_step(step + 1, rng)
        rewards.append(r)
        step_s.append(s)
        if (step + 1) % 10 == 0:
            print(f"  steps {step - 8}-{step + 1}: train reward {statistics.fmean(rewards[-10:]):.3f}, "
                  f"{statistics.median(step_s[-10:]):.2f} s/step", flush=True)  # fmt: skip

    evals, train, srl_gap = srl_records(args.run)
    print(f"\nsrl run {args.run.name}: step wall time {srl_gap:.2f} s (median trainer line interval); reference "
          f"{statistics.median(step_s):.2f} s/step (one thread, on-policy)")  # fmt: skip
    for s in sorted(evals):
        print(f"  srl eval step {s}: {evals[s][0]:.3f} +- {evals[s][1]:.3f}")
    for a in range(1, max(train, default=0) + 1, 10):
        block = [train[s] for s in range(a, a + 10) if s in train]
        if block:
            print(f"  srl steps {a}-{a + len(block) - 1}: train reward {statistics.fmean(block):.3f}")
    common = [s for s in sorted(evals) if s in readings and s > 0 and 0 in evals]
    if not common:
        print("no common eval step after 0: no verdict")
        return 0
    last = common[-1]
    srl_gain = evals[last][0] - evals[0][0]
    srl_se = math.hypot(evals[last][1], evals[0][1])  # unpaired: srl's two readings are separate draws
    ref_gain, ref_se = mean_se([a - b for a, b in zip(readings[last], readings[0], strict=True)])
    gap_se = math.hypot(srl_se, ref_se)
    ok = srl_gain >= ref_gain - 2 * gap_se
    print(f"\nat step {last}: srl gain {srl_gain:+.3f} +- {srl_se:.3f}, reference {ref_gain:+.3f} +- {ref_se:.3f}; "
          f"goal: srl >= reference - 2 x {gap_se:.3f}: {'PASS' if ok else 'MISS'}")  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
