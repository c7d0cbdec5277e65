"""Checks shared by the LoRA run tests: which policy the engines really sampled a batch from.

A low mismatch_kl alone cannot tell a served adapter from the base model when the adapter barely moved the policy,
so :func:`served_logprob_gaps` compares the batch's sampling logprobs with both the trainer's adapter model and the
base model; the tests require the first gap to be tiny and the second far larger.
"""

from __future__ import annotations

import json
from pathlib import Path


def load_adapter(model, adapter_dir: str | Path) -> None:
    """Load ``adapter_model.safetensors`` from ``adapter_dir`` into the peft model's active adapter, in place.

    Raises FileNotFoundError when the file is missing, ValueError when the file's names or shapes do not match
    the model's adapter (a different rank or target modules).
    """
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    from toolkit.trainer.lora import ADAPTER_WEIGHTS_FILE, adapter_state_dict

    path = Path(adapter_dir) / ADAPTER_WEIGHTS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no {ADAPTER_WEIGHTS_FILE} in {adapter_dir}")
    tensors = load_file(str(path))
    expected = adapter_state_dict(model)
    if set(tensors) != set(expected):
        missing, extra = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
        raise ValueError(f"adapter in {adapter_dir} does not fit the model: missing {missing[:4]}, extra {extra[:4]}")
    for k, t in tensors.items():
        if t.shape != expected[k].shape:
            raise ValueError(f"adapter tensor {k}: shape {tuple(t.shape)} in file, {tuple(expected[k].shape)} in model")
    set_peft_model_state_dict(model, tensors)


def _token_logprobs(model, ids, torch):
    """Natural-log probability of each token given the ones before it (index 0: 0.0), shape [T]."""
    with torch.no_grad():
        logits = model(input_ids=ids[None]).logits[0].float()
    lp = torch.log_softmax(logits[:-1], -1).gather(-1, ids[1:, None])[:, 0]
    return torch.cat([torch.zeros(1), lp])


def served_logprob_gaps(run: Path, batch_step: int, adapter_step: int, model_name: str = "tiny-qwen3"):
    """Mean |sampling logprob - model logprob| over the sampled tokens of ``rollouts/step_<batch_step>``, for the
    base model with the adapter broadcast at ``adapter_step`` loaded, and for the base model alone.

    Returns ``(gap_adapter, gap_base, tokens)`` (nats per token, nats per token, count). Imports torch and peft.
    """
    import torch

    from toolkit.batches import load_batch_dir
    from toolkit.models import resolve_model
    from toolkit.run.layout import RunDir
    from toolkit.trainer.lora import apply_lora
    from toolkit.trainer.model import load_policy

    rd = RunDir(run)
    batch = load_batch_dir(rd.rollout_step(batch_step))
    model_dir = resolve_model(model_name)
    base = load_policy(model_dir)
    lora_cfg = json.loads((rd.broadcast_step(adapter_step) / "adapter_config.json").read_text())
    policy = apply_lora(
        load_policy(model_dir),
        {
            "rank": lora_cfg["r"],
            "alpha": lora_cfg["lora_alpha"],
            "dropout": 0.0,
            "target_modules": lora_cfg["target_modules"],
        },
    )
    load_adapter(policy, rd.broadcast_step(adapter_step))
    base.eval()
    policy.eval()
    gap_policy, gap_base, n = 0.0, 0.0, 0
    for i in range(batch.num_samples):
        sl = batch.sample_slice(i)
        ids = torch.as_tensor(batch.input_ids[sl].astype("int64"))
        mask = torch.as_tensor(batch.loss_mask[sl])
        infer = torch.as_tensor(batch.inference_logprobs[sl])
        gap_policy += (_token_logprobs(policy, ids, torch) - infer)[mask].abs().sum().item()
        gap_base += (_token_logprobs(base, ids, torch) - infer)[mask].abs().sum().item()
        n += int(mask.sum())
    return gap_policy / n, gap_base / n, n


ADAPTER_BROADCAST = ["STABLE", "adapter_config.json", "adapter_model.safetensors"]


def assert_adapter_broadcasts(run: Path, steps) -> None:
    """Every broadcast of ``steps`` is a PEFT adapter directory (no full weights), STABLE included."""
    for step in steps:
        files = sorted(p.name for p in (Path(run) / "broadcasts" / f"step_{step}").iterdir())
        assert files == ADAPTER_BROADCAST, (step, files)


def assert_serves_adapter(run: Path, batch_step: int, adapter_step: int) -> tuple[float, float, int]:
    """Batch ``batch_step`` was sampled by the adapter of ``adapter_step``: its sampling logprobs match the adapter
    model (gap < 1e-3 nats per token) and are far from the base model's (20x the gap, so the adapter really moved
    the policy and the check can tell them apart). Returns :func:`served_logprob_gaps`'s figures."""
    gap_adapter, gap_base, n = served_logprob_gaps(run, batch_step=batch_step, adapter_step=adapter_step)
    assert gap_adapter < 1e-3, (gap_adapter, gap_base)
    assert gap_base > 20 * max(gap_adapter, 1e-5), "the adapter did not move the policy: the test cannot tell"
    return gap_adapter, gap_base, n
