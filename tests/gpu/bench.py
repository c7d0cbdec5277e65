"""GPU readiness figures of srl's trainer: MFU of its train step, checkpoint and weight-broadcast write rates.

    tests/gpu/run.sh                 # one GPU: a 0.5B Qwen3-shaped model, bf16, packed RL-like batches
    tests/gpu/run.sh --cpu           # CPU dry mode: srl's tiny model shape, a few seconds (CI runs this)

The model is built here, from nothing (no model hub): a random-init ``Qwen3ForCausalLM`` written as a HF directory
and loaded through srl's own ``toolkit.trainer.model.load_policy`` (SDPA, untied output layer, as the trainer
loads a policy; bf16 on GPU, fp32 in the CPU dry mode). The GPU shape is Qwen3-0.6B's decoder (28 layers, hidden 1024,
16 query and 8 key/value heads of 128, MLP 3072) with a 32,768-token vocabulary and its own output layer: 0.51B
parameters. The CPU dry mode uses srl's tiny shape (``toolkit.models.tiny.TINY_SHAPE``).

Each step is srl's ``toolkit.trainer.step.train_step`` (IPO loss, AdamW from ``toolkit.trainer.optim``, gradient
clipping) on micro-batches packed by ``toolkit.trainer.packing.plan_micro_batches`` from an RL-like mix of sample
lengths (prompts 20-200 tokens, completions log-normal around 150, 8-700). Two set-ups are timed:
- ``plain``: the model as srl's trainer holds it on one GPU (``shard_model`` shards only from 2 ranks);
- ``fsdp2``: the same model wrapped by FSDP2 ``fully_shard`` per decoder layer and then the root, as
  ``toolkit.trainer.dist.shard_model`` does on a multi-GPU node (on one rank its gathers are local copies).

MFU = model FLOPs of the real tokens / step time / peak bf16 FLOP/s of the device. Model FLOPs per step: 6 x the
matmul parameters (every Linear, the output layer included; not the embedding lookup) x real tokens, plus causal
attention 6 x layers x (query heads x head_dim) x sum over samples of length^2 (packed samples attend only within
themselves). Padding is not counted. The trainer's own ``perf/mfu`` (6 x all parameters x tokens/s) is printed
next to it. Peak: srl's table (``toolkit.trainer.metrics.peak_flops``: H100/H200 989 TFLOP/s dense bf16);
``--peak-tflops`` overrides, and without a known peak MFU is printed as n/a.

Write rates (one checkpoint and one broadcast of the plain model after a step, so Adam's state exists), each
fsynced as srl writes them: ``toolkit.trainer.checkpoint.save_trainer_state`` (weights + optimizer state) and
``toolkit.trainer.broadcast.write_broadcast`` of ``full_state_dict`` (the policy the engines load); bytes on disk /
seconds, and the broadcast's device-to-host copy apart. Files go under ``--dir`` (default: a temporary directory).
Prints one line per figure; exits 1 if a step is not finite or the run does not fit its time budget.
"""

from __future__ import annotations

import argparse
import math
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import numpy as np
import torch
import torch.distributed as dist

from toolkit.batches import samples_to_batch
from toolkit.config.model import IPOLoss
from toolkit.models.tiny import TINY_SHAPE, quiet_transformers
from toolkit.run.layout import RunDir
from toolkit.run.types import TrainingSample
from toolkit.trainer.broadcast import model_config_dict, write_broadcast
from toolkit.trainer.checkpoint import save_trainer_state
from toolkit.trainer.dist import decoder_layers
from toolkit.trainer.metrics import peak_flops
from toolkit.trainer.model import full_state_dict, load_policy, torch_dtype
from toolkit.trainer.optim import build_optimizer
from toolkit.trainer.packing import plan_micro_batches
from toolkit.trainer.step import train_step

# Qwen3-0.6B's decoder with a 32k vocabulary and an untied output layer: 0.51B parameters.
GPU_SHAPE = {
    "hidden_size": 1024,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 3072,
    "max_position_embeddings": 32768,
    "vocab_size": 32768,
}
CPU_SHAPE = {**TINY_SHAPE, "vocab_size": 101}


def build_model_dir(out: Path, shape: dict, dtype: torch.dtype, seed: int = 0) -> Path:
    """A random-init Qwen3ForCausalLM of ``shape`` saved as a HF directory (safetensors, untied)."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    cfg = Qwen3Config(**shape, tie_word_embeddings=False, bos_token_id=None, eos_token_id=2, pad_token_id=0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    with quiet_transformers():
        model.save_pretrained(out, safe_serialization=True)
    return out


def rl_like_batch(n: int, vocab: int, seed: int = 0):
    """``n`` samples: prompts 20-200 tokens, completions log-normal around 150 tokens (8..700); random advantages."""
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(n):
        p, c = int(rng.integers(20, 200)), int(np.clip(rng.lognormal(5.0, 0.7), 8, 700))
        samples.append(
            TrainingSample(
                rng.integers(4, vocab, p).tolist(),
                rng.integers(4, vocab, c).tolist(),
                [True] * c,
                (-rng.random(c) * 3).tolist(),
            )
        )
    batch = samples_to_batch(1, samples, rng.normal(size=n).tolist(), policy_versions=[0] * n, envs=["bench"] * n)
    return batch, [len(s.prompt_ids) + len(s.completion_ids) for s in samples]


def matmul_params(model: torch.nn.Module) -> int:
    """Parameters of every Linear layer (the output layer included), i.e. those that cost 2 FLOPs per token."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def step_flops(model_cfg, n_matmul: int, lengths: list[int]) -> float:
    """Training FLOPs (forward + backward) of one step over samples of ``lengths`` tokens (see module doc)."""
    d_attn = model_cfg.num_attention_heads * getattr(
        model_cfg, "head_dim", model_cfg.hidden_size // model_cfg.num_attention_heads
    )
    return 6.0 * n_matmul * sum(lengths) + 6.0 * model_cfg.num_hidden_layers * d_attn * sum(n * n for n in lengths)


def device_peak(device: torch.device, override_tflops: float | None) -> tuple[float | None, str]:
    """Peak bf16 FLOP/s (srl's table, ``toolkit.trainer.metrics.peak_flops``, or the override) and its source."""
    if override_tflops:
        return override_tflops * 1e12, f"{override_tflops:g} TFLOP/s (--peak-tflops)"
    if device.type != "cuda":
        return None, "unknown for CPU (give --peak-tflops)"
    peak, name = peak_flops(device), torch.cuda.get_device_name(device)
    return peak, (f"{peak / 1e12:g} TFLOP/s ({name}, dense bf16)" if peak else f"unknown for {name} (--peak-tflops)")


def init_one_rank(device: torch.device) -> None:
    """A process group of this process alone (FSDP2 needs one), unless torchrun set one up."""
    if dist.is_initialized():
        return
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group(
        backend="nccl" if device.type == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1
    )


def time_steps(model, mbs, num_samples: int, device, warmup: int, steps: int) -> list[float]:
    """Seconds of each of ``steps`` train steps after ``warmup`` ones; raises if a step is not finite."""
    opt = build_optimizer(model, lr=1e-5, weight_decay=0.0, betas=(0.9, 0.999))
    times = []
    for i in range(warmup + steps):
        m = train_step(model, opt, None, mbs, loss_cfg=IPOLoss(), max_norm=1.0, num_samples=num_samples, device=device)
        if m["optim/skipped_update"] or not math.isfinite(m["loss/mean"]):
            raise SystemExit(f"step {i}: not finite: {m}")
        if i >= warmup:
            times.append(m["time/step"])
    return times


def tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cpu", action="store_true", help="dry mode on CPU with srl's tiny model shape")
    ap.add_argument("--samples", type=int, default=None, help="samples per step (GPU 512, CPU 8)")
    ap.add_argument("--seq-len", type=int, default=None, help="tokens per packed row (GPU 16384, CPU 1024)")
    ap.add_argument("--micro-batch-size", type=int, default=1, help="packed rows per forward")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per set-up (GPU 8, CPU 1)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps first (GPU 2, CPU 1)")
    ap.add_argument("--peak-tflops", type=float, default=None, help="device peak bf16 TFLOP/s for MFU")
    ap.add_argument("--dir", type=Path, default=None, help="where checkpoint and broadcast are written")
    ap.add_argument("--budget-s", type=float, default=None, help="fail when the run takes longer (GPU 450)")
    a = ap.parse_args(argv)
    t_start = time.monotonic()
    if a.cpu:
        # fp32: CPU bf16 matmuls are emulated on many CPUs and would only measure that.
        device, shape, dtype = torch.device("cpu"), CPU_SHAPE, "float32"
        samples, seq_len, steps, warmup, budget = a.samples or 8, a.seq_len or 1024, a.steps or 1, a.warmup or 1, 300
    else:
        if not torch.cuda.is_available():
            print("no CUDA device: run with --cpu for the dry mode", file=sys.stderr)
            return 2
        device, shape, dtype = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))), GPU_SHAPE, "bfloat16"
        torch.cuda.set_device(device)
        samples, seq_len, steps, warmup, budget = a.samples or 512, a.seq_len or 16384, a.steps or 8, a.warmup or 2, 450
    budget = a.budget_s or budget
    work = a.dir or Path(tempfile.mkdtemp(prefix="srl-gpu-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)

    t = time.monotonic()
    model_dir = build_model_dir(work / "model", shape, torch_dtype(dtype))
    with quiet_transformers():
        plain = load_policy(model_dir, dtype=dtype, device=str(device))
    n_params = sum(p.numel() for p in plain.parameters())
    n_matmul = matmul_params(plain)
    print(
        f"model: Qwen3ForCausalLM {n_params / 1e9:.4f}B parameters ({n_matmul / 1e9:.4f}B in matmuls), {dtype}, "
        f"on {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}; built and loaded in "
        f"{time.monotonic() - t:.1f} s",
        flush=True,
    )

    batch, lengths = rl_like_batch(samples, shape["vocab_size"])
    mbs = plan_micro_batches(batch, seq_len=seq_len, micro_batch_size=a.micro_batch_size)
    flops = step_flops(plain.config, n_matmul, lengths)
    peak, peak_text = device_peak(device, a.peak_tflops)
    efficiency = sum(mb.real_tokens for mb in mbs) / sum(mb.processed_tokens for mb in mbs)  # padding excluded
    print(
        f"batch: {samples} samples, {batch.num_tokens} real tokens, {len(mbs)} micro-batches of "
        f"{a.micro_batch_size} x {seq_len}, packing efficiency {efficiency:.3f}; "
        f"{flops / 1e12:.4g} TFLOP per step; peak {peak_text}",
        flush=True,
    )

    def report(name: str, times: list[float]) -> None:
        step = statistics.median(times)
        achieved = flops / step
        mfu = f"{achieved / peak:.1%}" if peak else "n/a"
        # What the trainer logs as perf/mfu: 6 x all parameters x tokens/s, attention left out.
        logged = f"{6 * n_params * batch.num_tokens / step / peak:.1%}" if peak else "n/a"
        print(
            f"MFU {name}: {mfu} ({achieved / 1e12:.4g} TFLOP/s achieved, step {step:.3f} s median of "
            f"{len(times)}, {batch.num_tokens / step:,.0f} tokens/s; the trainer's perf/mfu formula gives "
            f"{logged})",
            flush=True,
        )

    report("plain", time_steps(plain, mbs, batch.num_samples, device, warmup, steps))

    # Checkpoint and broadcast of the plain model, as srl's trainer writes them on one GPU.
    run = RunDir(work / "run")
    run.root.mkdir(parents=True, exist_ok=True)
    opt = build_optimizer(plain, lr=1e-5, weight_decay=0.0, betas=(0.9, 0.999))
    train_step(
        plain, opt, None, mbs[:1], loss_cfg=IPOLoss(), max_norm=1.0, num_samples=batch.num_samples, device=device
    )
    t = time.perf_counter()
    part = save_trainer_state(run, 1, plain, opt, None)
    t_ckpt = time.perf_counter() - t
    size = tree_bytes(part)
    print(
        f"checkpoint write: {size / 1e6:.1f} MB in {t_ckpt:.2f} s = {size / t_ckpt / 1e6:.0f} MB/s "
        f"(weights + AdamW state, save_trainer_state, under {work})",
        flush=True,
    )
    t = time.perf_counter()
    sd = full_state_dict(plain)
    t_copy = time.perf_counter() - t
    final = write_broadcast(run, 1, sd, model_config_dict(plain), None)
    t_bcast = time.perf_counter() - t
    size = tree_bytes(final)
    print(
        f"broadcast write: {size / 1e6:.1f} MB in {t_bcast:.2f} s = {size / t_bcast / 1e6:.0f} MB/s "
        f"(device-to-host {t_copy:.2f} s, then write_broadcast with STABLE last)",
        flush=True,
    )
    del sd, opt, plain
    if device.type == "cuda":
        torch.cuda.empty_cache()

    # The same step under FSDP2, as shard_model applies it on a multi-GPU node.
    from torch.distributed.fsdp import fully_shard

    init_one_rank(device)
    with quiet_transformers():
        sharded = load_policy(model_dir, dtype=dtype, device=str(device))
    for layer in decoder_layers(sharded):
        fully_shard(layer)
    fully_shard(sharded)
    report("fsdp2", time_steps(sharded, mbs, batch.num_samples, device, warmup, steps))
    dist.destroy_process_group()

    elapsed = time.monotonic() - t_start
    ok = elapsed <= budget
    print(f"total {elapsed:.0f} s (budget {budget:.0f} s: {'met' if ok else 'NOT met'})", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
