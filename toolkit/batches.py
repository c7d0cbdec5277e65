"""The rollout-batch file format: what the orchestrator hands the trainer for one trainer step.

A batch lives in ``<run>/rollouts/step_<n>/`` (``RunDir.rollout_step(n)``)::

    batch.safetensors   flat per-token arrays + per-sample arrays (below)
    meta.json           {"format": 1, "step", "num_samples", "num_tokens", "envs": [...], "meta": {...}}
    READY               empty marker, written last

The directory is built under a temporary name and renamed into place (``fsutil.atomic_directory``), and
``READY`` is the last file written inside it, so a reader that sees ``READY`` sees the whole batch.

Arrays in ``batch.safetensors`` (T = total tokens of all samples, S = number of samples):

    input_ids           int32   [T]    prompt_ids + completion_ids of every sample, concatenated
    loss_mask           bool    [T]    True on policy-sampled completion tokens (the RL loss applies there)
    inference_logprobs  float32 [T]    sampling logprob (natural log) of each token; 0.0 where not sampled
    advantages          float32 [T]    the sample's advantage on every completion token, 0.0 on prompt tokens
    ce_mask             bool    [T]    tokens trained with a cross-entropy (NLL) term; all False by default
    ref_kl_mask         bool    [T]    policy-sampled tokens trained by distillation (reference-KL term) instead of
                                       the RL term; ``loss_mask`` is False on them
    ref_logprobs        float32 [T]    a reference model's logprob of each ``ref_kl_mask`` token; 0.0 elsewhere
    ref_topk_ids        int32   [T, K] with top-k distillation, the reference's K most likely tokens at each
                                       ``ref_kl_mask`` position (K = 0 without it); 0 elsewhere
    ref_topk_logprobs   float32 [T, K] their logprobs
    offsets             int64   [S+1]  sample i is tokens ``offsets[i]:offsets[i+1]``
    prompt_lens         int32   [S]    prompt tokens at the start of each sample
    policy_version      int64   [S]    oldest policy version that produced the sample's tokens

``meta["sampling"]`` (written by ``sampling_meta``) is the distribution the tokens were drawn from:
``{"temperature", "top_p", "top_k"}`` of the train sampling, which the trainer applies to its own logits so its
logprobs are those of that distribution (``Batch.sampling``). A batch without it was drawn from the policy itself
(temperature 1, no truncation).

Per-token values are aligned with ``input_ids``: ``inference_logprobs[t]`` is the logprob of token ``t`` given
tokens ``< t``. The first token of a sample has no context, so it can never carry loss (checked on write).

This module uses numpy and ``safetensors.numpy`` only (no torch): the orchestrator writes with it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from toolkit import fsutil
from toolkit.run.layout import RunDir
from toolkit.run.types import SamplingParams, TrainingSample

FORMAT_VERSION = 1
BATCH_FILE = "batch.safetensors"
META_FILE = "meta.json"
READY_MARKER = "READY"
SAMPLING_KEY = "sampling"  # the key of ``meta`` that records the sampled distribution

_TOKEN_ARRAYS = ("input_ids", "loss_mask", "inference_logprobs", "advantages", "ce_mask", "ref_kl_mask", "ref_logprobs")
_TOPK_ARRAYS = ("ref_topk_ids", "ref_topk_logprobs")  # [T, K]
# Arrays a batch written before distillation existed lacks; a reader fills them with "no distillation":
# name -> (dtype, per-token width; None for a [T] array, 0 for an empty [T, K])
_OPTIONAL_ARRAYS = {
    "ref_kl_mask": (bool, None),
    "ref_logprobs": (np.float32, None),
    "ref_topk_ids": (np.int32, 0),
    "ref_topk_logprobs": (np.float32, 0),
}
_SAMPLE_ARRAYS = ("prompt_lens", "policy_version")
_ARRAYS = (*_TOKEN_ARRAYS, *_TOPK_ARRAYS, *_SAMPLE_ARRAYS, "offsets")  # every array of batch.safetensors


@dataclass
class Batch:
    """One training batch in flat form (see the module docstring for every array's dtype and shape).

    ``envs[i]`` names the environment of sample i; ``meta`` is the orchestrator's metadata (the sampling the
    tokens were drawn from, step metrics, its resume state). ``step`` is the trainer step the batch is for.
    """

    step: int
    input_ids: np.ndarray
    loss_mask: np.ndarray
    inference_logprobs: np.ndarray
    advantages: np.ndarray
    ce_mask: np.ndarray
    offsets: np.ndarray
    prompt_lens: np.ndarray
    policy_version: np.ndarray
    envs: list[str]
    ref_kl_mask: np.ndarray
    ref_logprobs: np.ndarray
    ref_topk_ids: np.ndarray
    ref_topk_logprobs: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def sampling(self) -> SamplingParams:
        """The sampling the batch's tokens were drawn from (``meta["sampling"]``: temperature, top_p, top_k; the
        other fields are defaults). Temperature 1 without truncation when the batch records none. Raises
        ValueError on a record outside the values a train sampling can take."""
        rec = self.meta.get(SAMPLING_KEY)
        if rec is None:
            return SamplingParams()
        try:
            t, p, k = float(rec["temperature"]), float(rec["top_p"]), int(rec["top_k"] or 0)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"batch {self.step}: meta.sampling {rec!r} needs temperature, top_p, top_k") from e
        if not (t > 0 and 0 < p <= 1 and k >= 0):
            raise ValueError(
                f"batch {self.step}: meta.sampling {rec!r} is not a train sampling "
                "(temperature > 0, 0 < top_p <= 1, top_k >= 0)"
            )
        return SamplingParams(temperature=t, top_p=p, top_k=k or None)

    @property
    def num_samples(self) -> int:
        return int(len(self.offsets) - 1)

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def lengths(self) -> np.ndarray:
        """Tokens per sample, int64 [S]."""
        return np.diff(self.offsets)

    def sample_slice(self, i: int) -> slice:
        """Token range of sample ``i`` in the flat arrays."""
        return slice(int(self.offsets[i]), int(self.offsets[i + 1]))

    def validate(self) -> None:
        """Check shapes, dtypes and invariants; raises ValueError naming the first violation."""
        t, s = self.num_tokens, self.num_samples
        if self.offsets.ndim != 1 or s < 0 or int(self.offsets[0]) != 0 or int(self.offsets[-1]) != t:
            raise ValueError(f"offsets must run from 0 to num_tokens={t}, got {self.offsets[:1]}..{self.offsets[-1:]}")
        if np.any(np.diff(self.offsets) <= 0):
            raise ValueError("every sample must have at least one token (offsets strictly increasing)")
        for names, n in ((_TOKEN_ARRAYS, t), (_SAMPLE_ARRAYS, s)):
            for name in names:
                if getattr(self, name).shape != (n,):
                    raise ValueError(f"{name} has shape {getattr(self, name).shape}, expected ({n},)")
        k = self.ref_topk_ids.shape[1] if self.ref_topk_ids.ndim == 2 else -1
        for name in _TOPK_ARRAYS:
            if getattr(self, name).shape != (t, k):
                raise ValueError(f"{name} has shape {getattr(self, name).shape}, expected ({t}, K)")
        if len(self.envs) != s:
            raise ValueError(f"envs has {len(self.envs)} entries, expected {s}")
        starts = self.offsets[:-1]
        if np.any(self.loss_mask[starts]) or np.any(self.ce_mask[starts]) or np.any(self.ref_kl_mask[starts]):
            raise ValueError("the first token of a sample has no context and cannot carry loss (empty prompt?)")
        if np.any(self.loss_mask & self.ref_kl_mask):
            raise ValueError("a token is in both the RL term (loss_mask) and the distillation term (ref_kl_mask)")


def sampling_meta(sampling: SamplingParams) -> dict[str, Any]:
    """The ``meta["sampling"]`` record of a batch whose tokens were drawn with ``sampling``: its temperature,
    top_p and top_k (0: no top-k), the part of the sampling that shapes the distribution the trainer scores."""
    return {
        "temperature": float(sampling.temperature),
        "top_p": float(sampling.top_p),
        "top_k": int(sampling.top_k or 0),
    }


def samples_to_batch(
    step: int,
    samples: list[TrainingSample],
    advantages: list[float],
    *,
    policy_versions: list[int],
    envs: list[str],
    meta: dict[str, Any] | None = None,
    ce_masks: list[list[bool]] | None = None,
) -> Batch:
    """Flatten ``samples`` into a :class:`Batch`.

    ``advantages``, ``policy_versions`` and ``envs`` have one entry per sample. A sample's advantage is put on
    every completion token (prompt tokens get 0.0). ``ce_masks`` (optional, one per sample, completion length)
    marks completion tokens for the CE term. A sample with ``ref_logprobs`` (distillation) puts its policy tokens
    in ``ref_kl_mask`` with those logprobs, not in ``loss_mask``. Raises ValueError on mismatched lengths or an
    untrainable sample.
    """
    n = len(samples)
    for name, seq in (("advantages", advantages), ("policy_versions", policy_versions), ("envs", envs)):
        if len(seq) != n:
            raise ValueError(f"{name} has {len(seq)} entries for {n} samples (one per sample)")
    if ce_masks is not None and len(ce_masks) != n:
        raise ValueError(f"ce_masks has {len(ce_masks)} entries for {n} samples")
    ids, lm, lp, adv, ce, rm, rlp, prompt_lens = [], [], [], [], [], [], [], []
    widths = {len(smp.ref_topk_ids[0]) for smp in samples if smp.ref_topk_ids}
    if len(widths) > 1:
        raise ValueError(f"samples carry top-k lists of different widths {sorted(widths)}; one K per batch")
    k = widths.pop() if widths else 0
    tk_ids, tk_lps = [], []
    offsets = [0]
    for i, smp in enumerate(samples):
        p, c = len(smp.prompt_ids), len(smp.completion_ids)
        if not (len(smp.completion_mask) == c == len(smp.completion_logprobs)):
            raise ValueError(
                f"sample {i}: completion_ids/mask/logprobs lengths differ "
                f"({c}, {len(smp.completion_mask)}, {len(smp.completion_logprobs)})"
            )
        if p + c == 0:
            raise ValueError(f"sample {i} has no tokens")
        ids.append(np.asarray(list(smp.prompt_ids) + list(smp.completion_ids), dtype=np.int64))
        policy = np.concatenate([np.zeros(p, bool), np.asarray(smp.completion_mask, dtype=bool)])
        if smp.ref_logprobs is None:
            lm.append(policy)
            rm.append(np.zeros(p + c, bool))
            rlp.append(np.zeros(p + c, np.float32))
        else:
            if len(smp.ref_logprobs) != c:
                raise ValueError(
                    f"sample {i}: ref_logprobs has {len(smp.ref_logprobs)} entries for {c} completion tokens"
                )
            lm.append(np.zeros(p + c, bool))
            rm.append(policy)
            ref = np.concatenate([np.zeros(p, np.float32), np.asarray(smp.ref_logprobs, np.float32)])
            rlp.append(np.where(policy, ref, np.float32(0.0)))
        top_ids, top_lps = np.zeros((p + c, k), np.int64), np.zeros((p + c, k), np.float32)
        if k and smp.ref_topk_ids is not None and smp.ref_topk_logprobs is not None:
            top_ids[p:] = np.asarray(smp.ref_topk_ids, np.int64).reshape(c, k)
            top_lps[p:] = np.asarray(smp.ref_topk_logprobs, np.float32).reshape(c, k)
            top_ids[~policy], top_lps[~policy] = 0, 0.0
        tk_ids.append(top_ids)
        tk_lps.append(top_lps)
        lp.append(np.concatenate([np.zeros(p, np.float32), np.asarray(smp.completion_logprobs, np.float32)]))
        adv.append(np.concatenate([np.zeros(p, np.float32), np.full(c, advantages[i], np.float32)]))
        cm = np.zeros(c, bool) if ce_masks is None else np.asarray(ce_masks[i], dtype=bool)
        if cm.shape != (c,):
            raise ValueError(f"sample {i}: ce_mask has {cm.shape[0]} entries for {c} completion tokens")
        ce.append(np.concatenate([np.zeros(p, bool), cm]))
        prompt_lens.append(p)
        offsets.append(offsets[-1] + p + c)
    cat = (lambda xs, dt: np.concatenate(xs).astype(dt)) if n else (lambda xs, dt: np.zeros(0, dt))
    all_ids = cat(ids, np.int64)
    if all_ids.size and (all_ids.min() < 0 or all_ids.max() > np.iinfo(np.int32).max):
        raise ValueError("token ids must be in [0, 2**31)")
    batch = Batch(
        step=step,
        input_ids=all_ids.astype(np.int32),
        loss_mask=cat(lm, bool),
        inference_logprobs=cat(lp, np.float32),
        advantages=cat(adv, np.float32),
        ce_mask=cat(ce, bool),
        ref_kl_mask=cat(rm, bool),
        ref_logprobs=cat(rlp, np.float32),
        ref_topk_ids=(np.concatenate(tk_ids) if n else np.zeros((0, k))).astype(np.int32),
        ref_topk_logprobs=(np.concatenate(tk_lps) if n else np.zeros((0, k))).astype(np.float32),
        offsets=np.asarray(offsets, np.int64),
        prompt_lens=np.asarray(prompt_lens, np.int32),
        policy_version=np.asarray(policy_versions, np.int64),
        envs=[str(e) for e in envs],
        meta=dict(meta or {}),
    )
    batch.validate()
    return batch


def write_batch(
    run: RunDir,
    step: int,
    samples: list[TrainingSample],
    advantages: list[float],
    *,
    policy_versions: list[int],
    envs: list[str],
    meta: dict[str, Any],
    ce_masks: list[list[bool]] | None = None,
) -> Path:
    """Write the batch for trainer step ``step`` atomically to ``run.rollout_step(step)`` (READY last); returns
    that path.

    One advantage, policy version and env name per sample. Raises ValueError on malformed samples and
    OSError when the filesystem write fails (nothing is left under the final name then).
    """
    batch = samples_to_batch(
        step, samples, advantages, policy_versions=policy_versions, envs=envs, meta=meta, ce_masks=ce_masks
    )
    arrays = {name: np.ascontiguousarray(getattr(batch, name)) for name in _ARRAYS}
    header = {
        "format": FORMAT_VERSION,
        "step": batch.step,
        "num_samples": batch.num_samples,
        "num_tokens": batch.num_tokens,
        "envs": batch.envs,
        "meta": batch.meta,
    }
    final = run.rollout_step(step)
    with fsutil.atomic_directory(final) as tmp:
        fsutil.atomic_write_bytes(tmp / BATCH_FILE, st_save(arrays))
        fsutil.atomic_write_json(tmp / META_FILE, header)
        # No fsync of its own: the empty marker holds no data, and atomic_directory fsyncs the directory (entries
        # included) before renaming it into place, which is what makes READY durable.
        fsutil.write_marker(tmp / READY_MARKER, sync=False)
    return final


def is_ready(step_dir: Path) -> bool:
    """True when the batch directory has its READY marker (so every file in it is complete)."""
    return (Path(step_dir) / READY_MARKER).is_file()


def load_batch_dir(step_dir: Path) -> Batch:
    """Load a READY batch directory. Raises FileNotFoundError if not READY, ValueError if malformed."""
    step_dir = Path(step_dir)
    if not is_ready(step_dir):
        raise FileNotFoundError(f"batch {step_dir} has no {READY_MARKER} marker")
    meta = json.loads((step_dir / META_FILE).read_text())
    if meta.get("format") != FORMAT_VERSION:
        raise ValueError(f"{step_dir}: unsupported batch format {meta.get('format')!r}")
    arrays = st_load((step_dir / BATCH_FILE).read_bytes())
    n = len(arrays["input_ids"]) if "input_ids" in arrays else 0
    for name, (dtype, width) in _OPTIONAL_ARRAYS.items():
        arrays.setdefault(name, np.zeros(n if width is None else (n, width), dtype))
    batch = Batch(
        step=int(meta["step"]),
        envs=list(meta["envs"]),
        meta=dict(meta.get("meta", {})),
        **{k: arrays[k] for k in _ARRAYS},
    )
    batch.validate()
    return batch


def read_batch(
    run: RunDir,
    step: int,
    *,
    timeout_s: float,
    poll_s: float = 0.01,
    should_stop: Callable[[], bool] = lambda: False,
) -> Batch | None:
    """Wait (at most ``timeout_s`` seconds, polling every ``poll_s``) for the batch of ``step`` and load it.

    The poll is the trainer's hand-off latency: the batch is on the critical path of every step, so it is short
    (10 ms: a stat of one file, about 0.1 % of a core; 50 ms cost a tiny model's step about 25 ms on average).

    Returns None as soon as ``should_stop()`` is true (stop request while waiting). Raises TimeoutError naming
    the awaited path when ``timeout_s`` passes first, ValueError if the batch is malformed.
    """
    step_dir = run.rollout_step(step)
    deadline = time.monotonic() + timeout_s
    while True:
        if is_ready(step_dir):
            return load_batch_dir(step_dir)
        if should_stop():
            return None
        now = time.monotonic()
        if now >= deadline:
            raise TimeoutError(
                f"no batch for trainer step {step}: {step_dir / READY_MARKER} did not appear within {timeout_s:g} s"
            )
        time.sleep(min(poll_s, max(deadline - now, 0.0)))
