"""Benchmark: tokens/s of srl's train step vs a plain PyTorch loop on the same model and tokens, same run.

Also prints packing efficiency (real tokens / processed tokens) on a realistic length mix. Usage:
    python tests/benchmarks/trainer_step.py [--steps 5] [--samples 64] [--seq-len 1024]
Goals (issue 5): ratio >= 0.9, packing efficiency >= 0.95.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from toolkit.batches import samples_to_batch
from toolkit.models.tiny import build_tiny_model
from toolkit.run.types import TrainingSample
from toolkit.trainer.loss import IPOLoss
from toolkit.trainer.model import load_policy
from toolkit.trainer.optim import build_optimizer
from toolkit.trainer.packing import plan_micro_batches
from toolkit.trainer.step import train_step


def realistic_batch(n: int, seed: int = 0):
    """Prompts 20-200 tokens, completions log-normal around 150 tokens (clipped 8..700): an RL-like mix."""
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(n):
        p = int(rng.integers(20, 200))
        c = int(np.clip(rng.lognormal(5.0, 0.7), 8, 700))
        samples.append(
            TrainingSample(
                rng.integers(4, 100, p).tolist(),
                rng.integers(4, 100, c).tolist(),
                [True] * c,
                (-rng.random(c) * 3).tolist(),
            )
        )
    return samples_to_batch(1, samples, rng.normal(size=n).tolist(), policy_versions=[0] * n, envs=["e"] * n)


def plain_step(model, opt, mbs):
    """Baseline: same packed tensors, plain cross-entropy-style policy gradient, no metrics."""
    t0 = time.perf_counter()
    for mb in mbs:
        logits = model(input_ids=mb.input_ids, position_ids=mb.position_ids, use_cache=False).logits[:, :-1].float()
        lp = torch.log_softmax(logits, -1).gather(-1, mb.input_ids[:, 1:, None]).squeeze(-1)
        (-(lp * mb.advantages[:, 1:] * mb.loss_mask[:, 1:]).sum() / mb.loss_mask.sum()).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=1024)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        model_dir = build_tiny_model(Path(d) / "m", seed=0)
        batch = realistic_batch(args.samples)
        mbs = plan_micro_batches(batch, seq_len=args.seq_len, micro_batch_size=1)
        eff = sum(mb.real_tokens for mb in mbs) / sum(mb.processed_tokens for mb in mbs)  # padding excluded
        srl_model, base_model = load_policy(model_dir), load_policy(model_dir)
        srl_opt = build_optimizer(srl_model, lr=1e-4, weight_decay=0.0, betas=(0.9, 0.999))
        base_opt = torch.optim.AdamW(base_model.parameters(), lr=1e-4)
        srl_t, base_t = [], []
        for i in range(args.steps + 1):  # interleaved so load changes hit both; step 0 is warm-up
            m = train_step(
                srl_model, srl_opt, None, mbs, loss_cfg=IPOLoss(), max_norm=1.0, num_samples=batch.num_samples
            )
            b = plain_step(base_model, base_opt, mbs)
            if i:
                srl_t.append(m["time/step"])
                base_t.append(b)
        real = batch.num_tokens
        srl_tps, base_tps = real / np.median(srl_t), real / np.median(base_t)
        ok = eff >= 0.95 and srl_tps / base_tps >= 0.9
        print(f"tokens/step {real}  micro-batches {len(mbs)}  packing efficiency {eff:.3f} (goal >= 0.95)")
        print(
            f"srl train step {srl_tps:,.0f} tok/s  plain loop {base_tps:,.0f} tok/s  "
            f"ratio {srl_tps / base_tps:.3f} (goal >= 0.9)"
        )
        print(f"goals: {'met' if ok else 'NOT met'}")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
