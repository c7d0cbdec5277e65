"""Resource and cost envelope of a run: GPU-hours, checkpoint disk, rollout-store growth, memory per GPU.

Estimates, not measurements: each function names the formula and its source, so a reader can check the numbers.
Units: bytes, seconds, hours, parameters (counts). Nothing here imports torch; parameter counts come from
safetensors headers (the JSON header lists every tensor's shape, so no weights are read).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolkit.fsutil import read_json

# Bytes per parameter of one full fine-tune checkpoint (fp32 master weights 4 + AdamW first moment 4 + second
# moment 4). prime-rl's checkpoints measured ~7.2 GB for a 0.6B model and ~341 GB for 30.5B (11-12
# bytes/parameter).
CHECKPOINT_BYTES_PER_PARAM = 12.0
# Trainer model states per parameter with mixed-precision AdamW: bf16 weights 2 + bf16 gradients 2 + fp32 master,
# momentum and variance 12 = 16 bytes (Rajbhandari et al. 2020, "ZeRO", section 3.1: 2P + 2P + 12P).
TRAINER_STATE_BYTES_PER_PARAM = 16.0
# Rollout store: bytes per token (int32 id 4 + float32 logprob 4 + uint8 mask 1) and per rollout row (17 fixed
# 8-byte columns plus a few dynamic ones, ~32 columns x 8 bytes), from toolkit/run/store.py's layout.
STORE_BYTES_PER_TOKEN = 9.0
STORE_BYTES_PER_ROW = 256.0


def gpu_hours(num_nodes: int, gpus_per_node: int, wall_seconds: float) -> float:
    """GPU-hours billed for an allocation: nodes x GPUs per node x elapsed hours.

    Slurm bills the whole allocation for its elapsed time whether the GPUs are busy or not (sacct's
    ``AllocTRES=gres/gpu`` x ``Elapsed``), so idle inference GPUs during a trainer step still count.
    """
    return float(num_nodes) * float(gpus_per_node) * float(wall_seconds) / 3600.0


def checkpoint_disk_bytes(
    num_params: float, keep_last: int, bytes_per_param: float = CHECKPOINT_BYTES_PER_PARAM
) -> float:
    """Peak checkpoint disk: ``(keep_last + 1) x bytes_per_param x num_params``.

    The +1: a new checkpoint is written completely before the oldest is deleted, so ``keep_last + 1`` exist at the
    peak (the retention order prime-rl uses too).
    """
    return (keep_last + 1) * bytes_per_param * float(num_params)


def store_growth_bytes(rollouts: float, mean_tokens_per_rollout: float) -> float:
    """Rollout-store bytes for ``rollouts`` rows of ``mean_tokens_per_rollout`` tokens (prompt + completion):
    ``rollouts x (STORE_BYTES_PER_ROW + STORE_BYTES_PER_TOKEN x tokens)`` (uncompressed layout of toolkit/run/store.py).
    """
    return float(rollouts) * (STORE_BYTES_PER_ROW + STORE_BYTES_PER_TOKEN * float(mean_tokens_per_rollout))


def trainer_memory_per_gpu_bytes(
    num_params: float,
    world_size: int,
    *,
    tokens_per_micro_batch: int = 0,
    hidden_size: int = 0,
    num_layers: int = 0,
    vocab_size: int = 0,
) -> float:
    """Trainer memory per GPU with FSDP full sharding, mixed-precision AdamW and full activation checkpointing.

    ``16 x P / world_size`` model states (ZeRO-3 partitioning; Rajbhandari et al. 2020, section 3.1)
    ``+ 2 x T x h x L`` checkpointed bf16 layer inputs ``+ 34 x T x h`` one layer recomputed during backward
    (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", eq. 1 with
    flash attention dropping the ``5as/h`` term) ``+ 4 x T x V`` fp32 logits, where T is tokens per micro batch.
    Activation terms are skipped when the model shape is unknown (0). Excludes the CUDA context and fragmentation
    (add ~1-2 GiB in practice).
    """
    states = TRAINER_STATE_BYTES_PER_PARAM * float(num_params) / max(world_size, 1)
    t, h = float(tokens_per_micro_batch), float(hidden_size)
    activations = 2.0 * t * h * num_layers + 34.0 * t * h + 4.0 * t * float(vocab_size)
    return states + activations


def inference_weights_per_gpu_bytes(num_params: float, tensor_parallel_size: int = 1) -> float:
    """bf16 policy weights per inference GPU: ``2 x P / TP``. vLLM gives the rest of ``gpu_memory_utilization`` to
    the KV cache (per token ``2 x layers x kv_heads x head_dim x 2`` bytes; vLLM docs, "Engine arguments")."""
    return 2.0 * float(num_params) / max(tensor_parallel_size, 1)


def count_parameters(model_dir: Path) -> int | None:
    """Parameters of a HF-format model directory, summed from its ``*.safetensors`` headers (no weights read).

    safetensors files start with a little-endian u64 header length followed by a JSON header mapping tensor names
    to dtype and shape (safetensors format spec). Returns None when the directory has no safetensors files or a
    header cannot be read.
    """
    files = sorted(Path(model_dir).glob("*.safetensors")) if Path(model_dir).is_dir() else []
    if not files:
        return None
    total = 0
    try:
        for path in files:
            with open(path, "rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(n))
            for name, info in header.items():
                if name == "__metadata__":
                    continue
                numel = 1
                for dim in info["shape"]:
                    numel *= int(dim)
                total += numel
    except (OSError, ValueError, KeyError, struct.error):
        return None
    return total


def model_shape(model_dir: Path) -> dict[str, int]:
    """hidden_size, num_hidden_layers, vocab_size, num_key_value_heads, head_dim from ``config.json`` (0 if absent)."""
    cfg = read_json(Path(model_dir) / "config.json")
    cfg = cfg if isinstance(cfg, dict) else {}
    hidden = int(cfg.get("hidden_size", 0) or 0)
    heads = int(cfg.get("num_attention_heads", 0) or 0)
    return {
        "hidden_size": hidden,
        "num_hidden_layers": int(cfg.get("num_hidden_layers", 0) or 0),
        "vocab_size": int(cfg.get("vocab_size", 0) or 0),
        "num_key_value_heads": int(cfg.get("num_key_value_heads", heads) or 0),
        "head_dim": int(cfg.get("head_dim", hidden // heads if heads else 0) or 0),
    }


@dataclass
class Envelope:
    """The resource envelope of one run, as report rows. Any figure may be None when its input is unknown."""

    num_nodes: int | None
    gpus_per_node: int | None
    wall_seconds: float | None
    gpu_hours: float | None
    num_params: int | None
    keep_last: int | None
    checkpoint_disk_bytes: float | None
    store_bytes: float | None
    store_bytes_per_step: float | None
    trainer_memory_per_gpu_bytes: float | None
    inference_weights_per_gpu_bytes: float | None
    notes: list[str]

    def rows(self) -> list[tuple[str, str]]:
        """(label, value) pairs for a report table, with units."""

        def fmt_bytes(b: float | None) -> str:
            return "unknown" if b is None else _human_bytes(b)

        return [
            (
                "Allocation",
                "unknown" if self.num_nodes is None else f"{self.num_nodes} node(s) x {self.gpus_per_node} GPU(s)",
            ),
            (
                "Wall time (first start to last record)",
                "unknown" if self.wall_seconds is None else f"{self.wall_seconds / 3600:.3f} h",
            ),
            (
                "GPU-hours (nodes x GPUs/node x wall h)",
                "unknown" if self.gpu_hours is None else f"{self.gpu_hours:.3f}",
            ),
            ("Parameters", "unknown" if self.num_params is None else f"{self.num_params:,}"),
            ("Checkpoint disk ((keep_last+1) x 12 B/param)", fmt_bytes(self.checkpoint_disk_bytes)),
            ("Rollout store now", fmt_bytes(self.store_bytes)),
            ("Rollout store growth per step", fmt_bytes(self.store_bytes_per_step)),
            ("Trainer memory per GPU (FSDP, AdamW)", fmt_bytes(self.trainer_memory_per_gpu_bytes)),
            ("Inference weights per GPU (bf16)", fmt_bytes(self.inference_weights_per_gpu_bytes)),
        ]


def allocation(config: dict[str, Any]) -> tuple[int | None, int | None, int | None]:
    """(nodes, GPUs per node, trainer GPUs) implied by the resolved config's ``[deployment]`` section."""
    dep = config.get("deployment") if isinstance(config.get("deployment"), dict) else {}
    gpn = dep.get("gpus_per_node")
    if dep.get("type") == "multi_node":
        nodes = int(dep.get("num_train_nodes", 0) or 0) + int(dep.get("num_infer_nodes", 0) or 0)
        train_gpus = int(dep.get("num_train_nodes", 0) or 0) * int(gpn or 0)
        return (nodes or None, gpn, train_gpus or None)
    if dep:
        return (1, gpn, dep.get("num_train_gpus"))
    return (None, None, None)


def _model_dir(model_name: str | None, weights_dirs: list[Path] | None) -> Path | None:
    from toolkit.models.resolve import local_model_dir  # light: no torch, never builds

    found = local_model_dir(model_name) if model_name else None
    if found is not None and any(found.glob("*.safetensors")):
        return found
    return next((d for d in weights_dirs or [] if any(d.glob("*.safetensors"))), None)


def estimate(
    config: dict[str, Any],
    *,
    wall_seconds: float | None,
    store_path: Path | None,
    steps: int | None,
    weights_dirs: list[Path] | None = None,
) -> Envelope:
    """Build the :class:`Envelope` of a run from its resolved config, wall time (seconds), store file and step count.

    The model's parameter count and shape come from ``config["model"]["name"]`` when that is a local HF directory
    or a built-in alias already built in this machine's cache, else from the first of ``weights_dirs`` (the run's
    weight broadcasts, newest first: the policy itself, in HF layout) that holds safetensors files.
    """
    notes: list[str] = []
    nodes, gpn, train_gpus = allocation(config)
    hours = gpu_hours(nodes, gpn, wall_seconds) if nodes and gpn and wall_seconds is not None else None
    model_name = (config.get("model") or {}).get("name") if isinstance(config.get("model"), dict) else None
    model_dir = _model_dir(model_name, weights_dirs)
    num_params = count_parameters(model_dir) if model_dir else None
    if num_params is None:
        notes.append(
            "parameter count unknown (the model is neither a local safetensors directory nor a built "
            "alias, and the run kept no weight broadcast)"
        )
    ckpt = config.get("ckpt") if isinstance(config.get("ckpt"), dict) else {}
    keep_last = ckpt.get("keep_last")
    disk = checkpoint_disk_bytes(num_params, int(keep_last)) if num_params and keep_last is not None else None
    store_bytes = float(store_path.stat().st_size) if store_path is not None and store_path.exists() else None
    per_step = store_bytes / steps if store_bytes is not None and steps else None
    trainer_mem = infer_w = None
    if num_params:
        shape = model_shape(model_dir) if model_dir else {}
        trainer = config.get("trainer") if isinstance(config.get("trainer"), dict) else {}
        seq_len = int(trainer.get("seq_len", 0) or 0)
        micro = int(trainer.get("micro_batch_size", 1) or 1)
        trainer_mem = trainer_memory_per_gpu_bytes(
            num_params,
            int(train_gpus or 1),
            tokens_per_micro_batch=seq_len * micro,
            hidden_size=shape.get("hidden_size", 0),
            num_layers=shape.get("num_hidden_layers", 0),
            vocab_size=shape.get("vocab_size", 0),
        )
        vllm = ((config.get("inference") or {}).get("vllm") or {}) if isinstance(config.get("inference"), dict) else {}
        tp = int(vllm.get("tensor_parallel_size", vllm.get("tensor-parallel-size", 1)) or 1)
        infer_w = inference_weights_per_gpu_bytes(num_params, tp)
    return Envelope(
        num_nodes=nodes,
        gpus_per_node=gpn,
        wall_seconds=wall_seconds,
        gpu_hours=hours,
        num_params=num_params,
        keep_last=keep_last,
        checkpoint_disk_bytes=disk,
        store_bytes=store_bytes,
        store_bytes_per_step=per_step,
        trainer_memory_per_gpu_bytes=trainer_mem,
        inference_weights_per_gpu_bytes=infer_w,
        notes=notes,
    )


def _human_bytes(b: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(b) < 1024 or unit == "TiB":
            return f"{b:.1f} {unit}" if unit != "B" else f"{int(b)} B"
        b /= 1024
    return f"{b:.1f} TiB"
