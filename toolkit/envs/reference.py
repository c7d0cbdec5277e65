"""SFT data from a taskset's reference answers: the conversation RL would open with, plus the known-correct reply.

Each task becomes one prompt/completion row: ``prompt`` = the messages the policy sees first in an RL episode
(:func:`toolkit.envs.episode.initial_messages`: system prompt, then the task's prompt), ``completion`` = one
assistant message holding the task's reference answer (``data.answer``). SFT on these rows and RL on the same
taskset config therefore see the same prompt token ids.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from toolkit import fsutil


class NoReferenceAnswer(ValueError):
    """The taskset's tasks carry no reference answer (``data.answer``) to imitate."""


def reference_rows(taskset_cfg: Any) -> list[dict[str, Any]]:
    """One SFT row per selected task of ``taskset_cfg`` (a ``TasksetConfig``): ``{"id", "prompt", "completion"}``.

    Raises NoReferenceAnswer naming the taskset and the first task without a string ``answer``; the taskset's own
    load errors (ValueError, ImportError) pass through.
    """
    from toolkit.envs.episode import initial_messages
    from toolkit.envs.registry import load_tasks

    rows = []
    for i, task in enumerate(load_tasks(taskset_cfg)):
        data = task.data
        tid = data.id or i
        answer = getattr(data, "answer", None)  # a field of the taskset's own TaskData, when it has one
        if not isinstance(answer, str):
            raise NoReferenceAnswer(
                f"taskset {taskset_cfg.id!r}: task {tid} has no reference answer (data.answer "
                "must be a string) to write as a completion"
            )
        rows.append(
            {"id": str(tid), "prompt": initial_messages(data), "completion": [{"role": "assistant", "content": answer}]}
        )
    return rows


def write_reference_dataset(taskset_cfg: Any, out: Path) -> int:
    """Write :func:`reference_rows` as JSON Lines at ``out`` (atomically). Returns the row count.

    Raises ValueError, writing nothing, when the taskset selects no task (an existing ``out`` is kept: an empty
    file is no dataset ``srl sft`` reads).
    """
    rows = reference_rows(taskset_cfg)
    if not rows:
        raise ValueError(
            f"taskset {taskset_cfg.id!r} (split {taskset_cfg.split!r}) selects no "
            f"task; nothing written to {out} (raise its number of examples)"
        )
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fsutil.atomic_write_text(out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return len(rows)


__all__ = ["NoReferenceAnswer", "reference_rows", "write_reference_dataset"]
