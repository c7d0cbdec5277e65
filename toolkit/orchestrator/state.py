"""The orchestrator's part of a checkpoint: ``<run>/checkpoints/step_<n>/orchestrator/state.json``.

Holds what the orchestrator needs to continue after trainer step n: the step, the env sampler's state (RNG,
per-env epoch and position), the group counter, the served policy version and which eval steps are done. Written
with ``fsutil.atomic_directory`` (the part exists only when whole), then ``checkpoints.mark_complete_if_ready``
writes the step's COMPLETE marker when the trainer's part is there too.
"""

from __future__ import annotations

import json
from typing import Any

from toolkit import checkpoints, fsutil
from toolkit.run.layout import RunDir

PART = "orchestrator"
STATE_FILE = "state.json"
FORMAT = 1


def save_state(run: RunDir, step: int, state: dict[str, Any]) -> None:
    """Write the orchestrator part of checkpoint ``step`` and mark the step complete if the trainer's part exists.

    ``state`` must be JSON-able. Raises OSError on a failed write (nothing is left under the final name then).
    """
    with fsutil.atomic_directory(checkpoints.part_dir(run, step, PART)) as tmp:
        fsutil.atomic_write_json(tmp / STATE_FILE, {"format": FORMAT, "step": step, **state})
    checkpoints.mark_complete_if_ready(run, step)


def load_state(run: RunDir, step: int) -> dict[str, Any] | None:
    """The orchestrator state saved with checkpoint ``step``, or None when that part has no state file.

    Raises ValueError for an unknown format.
    """
    path = checkpoints.part_dir(run, step, PART) / STATE_FILE
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    if data.get("format") != FORMAT:
        raise ValueError(f"{path}: unknown orchestrator state format {data.get('format')!r}")
    return data


def is_checkpoint_step(step: int, max_steps: int, interval: int | None) -> bool:
    """Whether the trainer checkpoints at ``step``: every ``interval`` steps and at the final step."""
    return step == max_steps or bool(interval and step % interval == 0)
