"""Benchmark: srl's SFT step (data -> packed CE-only batch -> the trainer's train step) in tokens/s, against a plain
PyTorch loop (masked NLL, AdamW, clipping) on the same model and the same packed batches, in the same run.

Usage:
    python tests/benchmarks/sft_step.py [--steps 20] [--batch-size 64] [--seq-len 512] [--rows 4000]
Goal: ratio >= 0.95. Exits 1 when the goal is missed. The two loops alternate step by step so that a change in the
machine's load hits both; the first step of each is a warm-up and is not counted.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from toolkit.config.sft import ColumnsConfig, LossMaskConfig
from toolkit.models.renderer import load_renderer
from toolkit.models.tiny import build_tiny_model
from toolkit.trainer.loss import IPOLoss
from toolkit.trainer.model import load_policy
from toolkit.trainer.optim import build_optimizer, build_scheduler
from toolkit.trainer.packing import plan_micro_batches
from toolkit.trainer.sft_data import SFTData, load_conversations, step_rows, to_batch
from toolkit.trainer.step import train_step

GOAL = 0.95


def _data(d: Path, rows: int, seq_len: int) -> tuple[Path, SFTData]:
    rng = np.random.default_rng(0)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    f = d / "data.jsonl"
    with open(f, "w") as out:
        for i in range(rows):
            w = "".join(rng.choice(letters, int(rng.integers(3, 40))))
            out.write(json.dumps({"id": i, "prompt": f"Reverse: {w}", "completion": w[::-1]}) + "\n")
    model_dir = build_tiny_model(d / "m", seed=0)
    convs, wheres = load_conversations(f, ColumnsConfig())
    data = SFTData.build(
        convs, load_renderer(None, model_dir), LossMaskConfig(), seq_len=seq_len, source=str(f), wheres=wheres
    )
    return model_dir, data


def plain_step(model, opt, mbs) -> float:
    """Baseline: the same packed tensors, masked NLL normalised by the step's trained tokens, no metrics."""
    t0 = time.perf_counter()
    n = sum(int(mb.ce_mask.sum()) for mb in mbs)
    for mb in mbs:
        logits = model(input_ids=mb.input_ids, position_ids=mb.position_ids, use_cache=False).logits[:, :-1].float()
        lp = torch.log_softmax(logits, -1).gather(-1, mb.input_ids[:, 1:, None]).squeeze(-1)
        (-(lp * mb.ce_mask[:, 1:]).sum() / n).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--rows", type=int, default=4000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir, data = _data(Path(tmp), args.rows, args.seq_len)
        srl_model, base_model = load_policy(model_dir), load_policy(model_dir)
        srl_opt = build_optimizer(srl_model, lr=1e-3, weight_decay=0.0, betas=(0.9, 0.999))
        sched = build_scheduler(srl_opt, kind="cosine", warmup_steps=2, total_steps=args.steps + 1)
        base_opt = torch.optim.AdamW(base_model.parameters(), lr=1e-3)
        srl_t, base_t, tokens = [], [], []
        for step in range(1, args.steps + 2):
            # srl's step includes what the SFT loop does per step: pick the rows, build the batch, pack it.
            t0 = time.perf_counter()
            rows, _ = step_rows(len(data), batch_size=args.batch_size, step=step, seed=0, shuffle=True)
            batch = to_batch(data, rows, step)
            mbs = plan_micro_batches(batch, seq_len=args.seq_len, micro_batch_size=4)
            train_step(srl_model, srl_opt, sched, mbs, loss_cfg=IPOLoss(), max_norm=1.0, num_samples=batch.num_samples)
            s = time.perf_counter() - t0
            b = plain_step(base_model, base_opt, mbs)
            if step > 1:
                srl_t.append(s)
                base_t.append(b)
                tokens.append(batch.num_tokens)
        srl_tps = sum(tokens) / sum(srl_t)
        base_tps = sum(tokens) / sum(base_t)
        ratio = srl_tps / base_tps
        ok = ratio >= GOAL
        print(f"steps {args.steps}  tokens/step {np.mean(tokens):,.0f}  rows {len(data)}")
        print(
            f"srl SFT step {srl_tps:,.0f} tok/s  plain PyTorch loop {base_tps:,.0f} tok/s  ratio {ratio:.3f} "
            f"(goal >= {GOAL}): {'PASS' if ok else 'MISS'}"
        )
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
