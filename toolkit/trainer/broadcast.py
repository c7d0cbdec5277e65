"""Weight broadcast over the shared filesystem: the policy after trainer step n as ``<run>/broadcasts/step_<n>/``.

The directory is a HF safetensors model directory (``model.safetensors``, ``config.json`` with untied
embeddings, and the tokenizer files of the base model) that vLLM can load or live-reload. It is written under a
temporary name, ``STABLE`` is the last file written, and the directory is renamed into place: a reader that sees
``STABLE`` sees complete weights (the file is policy version n).

Retention keeps at least ``max_async_level + 1`` STABLE broadcasts, because the orchestrator may still sample with
a policy that many versions old (field case B18); older ones are deleted only once a newer one is STABLE, and a
failed deletion is a warning, never a crash (NFS ``rmtree`` may fail with "directory not empty").
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from toolkit import fsutil
from toolkit.rundir import RunDir, numbered_steps

log = logging.getLogger(__name__)

STABLE_MARKER = "STABLE"
WEIGHTS_FILE = "model.safetensors"
# Files of a HF model directory that describe tokenisation and generation rather than weights.
_TOKENIZER_GLOBS = (
    "tokenizer*",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.*",
    "merges.txt",
    "*.model",
    "chat_template*",
    "generation_config.json",
)


def copy_tokenizer_files(src: Path, dst: Path) -> list[str]:
    """Copy the tokenizer/generation files of HF directory ``src`` into ``dst``; returns the names copied."""
    names = []
    for pattern in _TOKENIZER_GLOBS:
        for f in sorted(Path(src).glob(pattern)):
            if f.is_file() and f.name not in names:
                shutil.copyfile(f, dst / f.name)
                names.append(f.name)
    return names


def save_safetensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """Write ``tensors`` (contiguous CPU) to ``path`` as safetensors and fsync it.

    Streams from the tensors to the file (no whole-file copy in memory, unlike ``safetensors.torch.save``);
    the caller provides atomicity by writing inside a temporary directory.
    """
    save_file(tensors, str(path), metadata={"format": "pt"})
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_hf_dir(
    final: Path, state_dict: dict[str, torch.Tensor], config: dict, base_model_dir: Path | None, *, marker: str | None
) -> Path:
    """Atomically write ``state_dict`` (CPU tensors) + ``config`` + tokenizer files as HF directory ``final``.

    ``config`` is the model config as a dict; ``tie_word_embeddings`` is forced to False (the weights carry an
    explicit ``lm_head.weight``). ``marker`` (e.g. STABLE), if given, is the last file written. Raises OSError.
    """
    cfg = dict(config)
    cfg["tie_word_embeddings"] = False
    if isinstance(cfg.get("text_config"), dict):
        cfg["text_config"] = {**cfg["text_config"], "tie_word_embeddings": False}
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in state_dict.items()}
    with fsutil.atomic_directory(final) as tmp:
        save_safetensors(tmp / WEIGHTS_FILE, tensors)
        fsutil.atomic_write_text(tmp / "config.json", json.dumps(cfg, indent=2, sort_keys=True, default=str) + "\n")
        if base_model_dir is not None:
            copy_tokenizer_files(Path(base_model_dir), tmp)
        if marker:
            fsutil.write_marker(tmp / marker)
    return Path(final)


def model_config_dict(model: torch.nn.Module) -> dict:
    """The HF config of ``model`` (unwrapping a PEFT wrapper) as a JSON-ready dict."""
    cfg = getattr(model, "config", None)
    if cfg is None and hasattr(model, "get_base_model"):
        cfg = model.get_base_model().config
    return json.loads(cfg.to_json_string(use_diff=False))


def write_broadcast(
    run: RunDir, step: int, state_dict: dict[str, torch.Tensor], config: dict, base_model_dir: Path | None
) -> Path:
    """Write policy version ``step`` to ``run.broadcast_step(step)`` with ``STABLE`` last; returns the path."""
    return write_hf_dir(run.broadcast_step(step), state_dict, config, base_model_dir, marker=STABLE_MARKER)


def is_stable(step_dir: Path) -> bool:
    """True when a broadcast directory is complete (has its STABLE marker)."""
    return (Path(step_dir) / STABLE_MARKER).is_file()


def latest_stable(run: RunDir) -> int | None:
    """Newest STABLE broadcast step (= policy version), or None."""
    for s in reversed(numbered_steps(run.broadcasts)):
        if is_stable(run.broadcast_step(s)):
            return s
    return None


def broadcast_keep(max_async_level: int, keep: int | None = None) -> int:
    """How many STABLE broadcasts to keep: ``keep`` but never fewer than ``max_async_level + 1`` (B18)."""
    floor = max_async_level + 1
    return max(floor, keep or floor)


@dataclass
class BroadcastRetention:
    deleted: list[int]
    failed: list[int]


def apply_broadcast_retention(run: RunDir, keep: int) -> BroadcastRetention:
    """Delete broadcast dirs older than the ``keep`` newest STABLE ones; failures are logged, not raised.

    Nothing is deleted until ``keep`` STABLE broadcasts exist, and directories newer than the oldest kept one
    (including a non-STABLE one being written) are never touched.
    """
    stable = [s for s in numbered_steps(run.broadcasts) if is_stable(run.broadcast_step(s))]
    if keep < 1 or len(stable) <= keep:
        return BroadcastRetention([], [])
    oldest_kept = stable[-keep]
    deleted, failed = [], []
    for s in numbered_steps(run.broadcasts):
        if s >= oldest_kept:
            continue
        path = run.broadcast_step(s)
        try:
            doomed = path.with_name(f".{path.name}.tmp-delete-{os.getpid()}")
            path.rename(doomed)  # gone from step scans at once, even if rmtree fails half-way below
            shutil.rmtree(doomed)
            deleted.append(s)
        except OSError as e:
            log.warning("could not delete old broadcast %s: %s", path, e)
            failed.append(s)
    for leftover in run.broadcasts.glob(".step_*.tmp-delete-*"):
        shutil.rmtree(leftover, ignore_errors=True)
    return BroadcastRetention(deleted, failed)
