"""``srl export RUN [--step N] DIR``: one complete checkpoint of a run as a Hugging Face model directory.

The policy is rebuilt the way the trainer builds it (the run's model, LoRA wrapped around it when the run trains an
adapter), the trainer part of the checkpoint is loaded into it, a LoRA adapter is merged into its base with peft's
``merge_and_unload``, and the weights go out through the writer SFT exports use
(:func:`toolkit.trainer.broadcast.write_hf_dir`: ``model.safetensors``, ``config.json`` with untied embeddings, the
base model's tokenizer files). transformers and vLLM load the result as is.

Works for RL and SFT runs, one-process (``model.safetensors``) and multi-rank (``dcp/``) checkpoints alike.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolkit import checkpoints
from toolkit.run.layout import RunDir, numbered_steps

log = logging.getLogger(__name__)


class ExportError(ValueError):
    """The export cannot be made as asked (not a run, no such complete checkpoint, a non-empty target)."""


@dataclass(frozen=True)
class Exported:
    """What :func:`export_checkpoint` wrote: the directory, the checkpoint step and whether an adapter was merged."""

    path: Path
    step: int
    merged_lora: bool


def pick_step(run: RunDir, step: int | None) -> int:
    """The complete checkpoint step to export: ``step``, or the newest complete one when None.

    Raises ExportError naming the complete steps there are (and what an incomplete ``step`` lacks)."""
    parts = checkpoints.parts_of(run)
    complete = checkpoints.complete_steps(run, parts)
    listing = ", ".join(str(s) for s in complete) or "none"
    if step is None:
        if not complete:
            found = checkpoints.describe(run, parts)
            raise ExportError(
                f"{run.root} has no complete checkpoint to export"
                + (f":\n{found}" if found else f" ({run.checkpoints} is empty or missing)")
            )
        return complete[-1]
    if step in complete:
        return step
    if step in numbered_steps(run.checkpoints):
        defects = checkpoints.missing(run.checkpoint_step(step), parts)
        raise ExportError(
            f"checkpoint step {step} of {run.root} is incomplete (missing {', '.join(defects)}); "
            f"complete checkpoints: {listing}"
        )
    raise ExportError(f"{run.root} has no checkpoint of step {step}; complete checkpoints: {listing}")


def load_checkpoint_policy(run: RunDir, step: int) -> tuple[Any, Path, bool]:
    """The policy of checkpoint ``step`` as the trainer holds it: ``(model, base model directory, is_lora)``.

    The model is built as :func:`toolkit.trainer.main.start_training` builds it (same model, dtype, LoRA config) on
    CPU in one process, then the checkpoint's trainer weights are loaded: ``model.safetensors`` (one-process runs)
    or else the ``dcp/`` shards of a multi-rank run (read into the whole, unsharded model); the caller has checked
    that the trainer part holds one of them.
    """
    import torch

    from toolkit.models import resolve_model
    from toolkit.trainer.checkpoint import _load_weights
    from toolkit.trainer.main import TrainerSettings, load_run_config
    from toolkit.trainer.model import load_policy

    s = TrainerSettings.from_config(load_run_config(run))
    model_dir = Path(resolve_model(s.model_name))
    model = load_policy(model_dir, dtype=s.dtype, device="cpu", lora=s.lora)
    part = checkpoints.part_dir(run, step, "trainer")
    if (part / "model.safetensors").is_file():
        _load_weights(part / "model.safetensors", model)
    else:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

        # The trainer saved {"model", "optim"} with every rank's shards; only the model is read, resharded by DCP
        # into this one unsharded copy (no process group: DCP then reads in this process alone).
        state = {"model": get_model_state_dict(model)}
        dcp.load(state, checkpoint_id=str(part / "dcp"))
        set_model_state_dict(model, state["model"])
    model.eval()
    torch.set_grad_enabled(False)
    return model, model_dir, bool(s.lora)


def export_checkpoint(run_dir: Path, out: Path, step: int | None = None) -> Exported:
    """Write checkpoint ``step`` (default: the newest complete one) of the run at ``run_dir`` as a HF model
    directory at ``out`` (created; it may exist only as an empty directory). A LoRA run's adapter is merged into
    its base weights. Raises ExportError before loading anything when the run, the step or ``out`` is unusable
    (``out`` inside the run directory, also through a symlink or ``..``; a place that cannot be created).
    """
    # Resolved: a RUN or DIR reached through a symlink or ``..`` must still be seen inside the run directory.
    run = RunDir(Path(run_dir).resolve())
    if not run.root.is_dir():
        raise ExportError(f"{run_dir}: no such run directory")
    out = Path(out).resolve()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"{out} exists and is not an empty directory; give a new or empty directory")
    if run.root == out or run.root in out.parents:
        raise ExportError(f"{out} is inside the run directory {run.root}; export somewhere else")
    if not run.resolved("rl").is_file() and not run.resolved("sft").is_file():
        raise ExportError(
            f"{run.root} is not an srl run directory (no {run.resolved('rl')}); give outputs/<run "
            "name> (a sweep's runs are outputs/<sweep>/<point id>)"
        )
    step = pick_step(run, step)
    part = checkpoints.part_dir(run, step, "trainer")
    if not (part / "model.safetensors").is_file() and not (part / "dcp").is_dir():
        raise ExportError(
            f"checkpoint step {step} of {run.root} is marked complete but {part} holds neither "
            "model.safetensors nor dcp/ (deleted or copied in part?)"
        )
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)  # now, not after minutes of loading: an unusable DIR fails first
    except OSError as e:
        raise ExportError(f"cannot create {out}: {e.strerror or e}") from None
    try:
        from toolkit.trainer.broadcast import model_config_dict, write_hf_dir

        model, model_dir, lora = load_checkpoint_policy(run, step)
        if lora:
            model = model.merge_and_unload()  # W + (alpha / r) * B A folded into each target layer; plain HF modules
        weights = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
        out.rmdir()  # empty (checked above): the atomic writer renames its finished directory into this place
        write_hf_dir(out, weights, model_config_dict(model), model_dir, marker=None)
    except BaseException:
        if created and out.is_dir() and not any(out.iterdir()):
            out.rmdir()
        raise
    return Exported(path=out, step=step, merged_lora=lora)
