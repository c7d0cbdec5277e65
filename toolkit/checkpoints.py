"""Which checkpoints are complete, which one to resume from, and which ones retention may delete (no torch).

Layout: ``<run>/checkpoints/step_<n>/{trainer/, orchestrator/, COMPLETE}``. Each component writes its part with
``fsutil.atomic_directory`` (so a part directory that exists is whole) and then calls
:func:`mark_complete_if_ready`; whichever component finishes second sees both parts and writes ``COMPLETE``.
Both rename before they look, so at least one of them sees both parts.

A step is usable for resume only with ``COMPLETE`` *and* every part present ("latest" must never mean
"highest-numbered directory": that one may be half-written). When step directories exist but none is usable,
resume fails loudly instead of starting from step 0.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from toolkit import fsutil
from toolkit.run.layout import COMPLETE_MARKER, RunDir, numbered_steps

log = logging.getLogger(__name__)

PARTS: tuple[str, ...] = ("trainer", "orchestrator")
SFT_PARTS: tuple[str, ...] = ("trainer",)
"""An SFT run's checkpoints have the trainer part only (there is no orchestrator state to keep)."""


def parts_of(run: RunDir) -> tuple[str, ...]:
    """The parts a complete checkpoint of ``run`` has: :data:`SFT_PARTS` for an SFT run (its latest attempt's
    resolved config is ``sft.json``), else :data:`PARTS`."""
    return SFT_PARTS if run.run_config().name == "sft.json" else PARTS


class CheckpointError(RuntimeError):
    """No usable checkpoint where one is required (the message lists every step directory and its defect)."""


def part_dir(run: RunDir, step: int, part: str) -> Path:
    """Directory of one component's part of the step-``step`` checkpoint (``trainer`` or ``orchestrator``)."""
    return run.checkpoint_step(step) / part


def missing(step_dir: Path, parts: tuple[str, ...] = PARTS) -> list[str]:
    """What keeps ``step_dir`` from being complete: missing parts (``"trainer/"``) and/or ``"COMPLETE marker"``."""
    step_dir = Path(step_dir)
    out = [f"{p}/" for p in parts if not (step_dir / p).is_dir()]
    if not (step_dir / COMPLETE_MARKER).is_file():
        out.append(f"{COMPLETE_MARKER} marker")
    return out


def is_complete(step_dir: Path, parts: tuple[str, ...] = PARTS) -> bool:
    """True when ``step_dir`` has its COMPLETE marker and every part directory."""
    return not missing(step_dir, parts)


def mark_complete_if_ready(run: RunDir, step: int, parts: tuple[str, ...] | None = None) -> bool:
    """Write ``COMPLETE`` for ``step`` if every part is present; returns whether the step is complete now.

    Idempotent; safe when both components call it at the same time (the marker write is atomic).
    """
    parts = parts or parts_of(run)
    step_dir = run.checkpoint_step(step)
    if any(not (step_dir / p).is_dir() for p in parts):
        return False
    fsutil.write_marker(step_dir / COMPLETE_MARKER)
    return True


def complete_steps(run: RunDir, parts: tuple[str, ...] | None = None) -> list[int]:
    """Steps with a complete checkpoint, ascending."""
    parts = parts or parts_of(run)
    return [s for s in numbered_steps(run.checkpoints) if is_complete(run.checkpoint_step(s), parts)]


def latest_complete(run: RunDir, parts: tuple[str, ...] | None = None) -> int | None:
    """Newest complete checkpoint step, or None. Logs a warning naming every newer incomplete step it skips."""
    parts = parts or parts_of(run)
    for s in reversed(numbered_steps(run.checkpoints)):
        defects = missing(run.checkpoint_step(s), parts)
        if not defects:
            return s
        log.warning("skipping incomplete checkpoint %s (missing %s)", run.checkpoint_step(s), ", ".join(defects))
    return None


def describe(run: RunDir, parts: tuple[str, ...] | None = None) -> str:
    """One line per step directory: ``step_<n>: complete`` or ``step_<n>: missing trainer/, COMPLETE marker``."""
    parts = parts or parts_of(run)
    defects = {d: missing(d, parts) for d in (run.checkpoint_step(s) for s in numbered_steps(run.checkpoints))}
    return "\n".join(f"  {d}: " + ("missing " + ", ".join(m) if m else "complete") for d, m in defects.items())


def resume_step(run: RunDir, requested: int | None, parts: tuple[str, ...] | None = None) -> int | None:
    """The checkpoint step to resume from, or None for a fresh start (no step directories at all).

    ``requested`` None means the newest complete checkpoint (incomplete newer ones are skipped with a warning);
    None also when the only step directories hold nothing but orchestrator parts (written ahead of the trainer's
    first checkpoint, so no trainer state exists to lose). Raises CheckpointError, listing every step directory and what
    it lacks, when ``requested`` is given and not complete, or when step directories exist but none is complete (never a
    silent restart from step 0).
    """
    parts = parts or parts_of(run)
    steps = numbered_steps(run.checkpoints)
    if requested is not None:
        step_dir = run.checkpoint_step(requested)
        defects = missing(step_dir, parts)
        if defects:
            raise CheckpointError(
                f"cannot resume from step {requested}: {step_dir} is not a complete checkpoint "
                f"(missing {', '.join(defects)}). Checkpoint directories:\n{describe(run, parts) or '  (none)'}"
            )
        return requested
    if not steps:
        return None
    found = latest_complete(run, parts)
    if found is None and all(_written_ahead(run.checkpoint_step(s), parts) for s in steps):
        # The orchestrator saves its part of step n when it writes batch n, ahead of the trainer; a crash before the
        # trainer's first checkpoint leaves only such parts. No trainer state was ever saved, so nothing is lost by
        # starting at step 0 (the orchestrator continues after the batches already written).
        log.warning(
            "no complete checkpoint yet, only orchestrator parts written ahead of the trainer (%s): "
            "starting from step 0",
            ", ".join(f"step_{s}" for s in steps),
        )
        return None
    if found is None:
        raise CheckpointError(
            f"{run.checkpoints} has checkpoint directories but none is complete, so the run cannot resume "
            f"(refusing to restart from step 0):\n{describe(run, parts)}\n"
            "Fix or remove these directories, or start a new run directory."
        )
    return found


def _written_ahead(step_dir: Path, parts: tuple[str, ...]) -> bool:
    # Only the first-writing component's part (the orchestrator; the trainer's part always comes last) and no marker.
    present = {p for p in parts if (step_dir / p).is_dir()}
    return not (step_dir / COMPLETE_MARKER).exists() and present <= {"orchestrator"}


@dataclass
class RetentionResult:
    """Steps deleted and steps whose deletion failed (the failure is logged, never raised)."""

    deleted: list[int]
    failed: list[int]


def delete_steps(steps: list[int], step_dir: Callable[[int], Path]) -> RetentionResult:
    """Delete the directory ``step_dir(s)`` of each of ``steps`` (what checkpoint or broadcast retention drops).

    Each is renamed to a dot-name first, so a half-deleted directory never looks like a step (NFS ``rmtree`` can
    fail with "directory not empty"). A failure is a warning; the renamed leftovers are retried at every call.
    """
    result = RetentionResult([], [])
    for s in steps:
        path = step_dir(s)
        try:
            doomed = path.with_name(f".{path.name}.tmp-delete-{os.getpid()}")
            path.rename(doomed)
            shutil.rmtree(doomed)
            result.deleted.append(s)
        except OSError as e:
            log.warning("could not delete %s: %s (retried at the next retention pass)", path, e)
            result.failed.append(s)
    # Only our own renamed-for-deletion leftovers: other dot-temps may belong to a writer that is still running.
    for leftover in step_dir(0).parent.glob(".step_*.tmp-delete*"):
        shutil.rmtree(leftover, ignore_errors=True)
    return result


def apply_retention(
    run: RunDir, keep_last: int | None, keep_interval: int | None = None, parts: tuple[str, ...] | None = None
) -> RetentionResult:
    """Delete checkpoints no longer needed; call only after a new checkpoint became COMPLETE.

    Kept: the ``keep_last`` newest complete checkpoints (None or < 1 = keep everything), every complete one whose
    step is a multiple of ``keep_interval``, and every directory newer than the newest complete one (possibly being
    written). Deleted: other complete ones and incomplete ones older than the newest complete one (unusable for
    resume). The newest complete checkpoint is never deleted. Deletion failures are warnings.
    """
    if keep_last is None or keep_last < 1 or not (complete := complete_steps(run, parts)):
        return RetentionResult([], [])
    newest = complete[-1]
    keep = set(complete[-keep_last:]) | {newest}
    if keep_interval:
        keep |= {s for s in complete if s % keep_interval == 0}
    doomed = [s for s in numbered_steps(run.checkpoints) if s < newest and s not in keep]
    return delete_steps(doomed, run.checkpoint_step)
