"""``metrics.jsonl``: one JSON object per line, appended by the trainer's main rank and by the orchestrator.

Every line has ``role`` ("trainer", "orchestrator") and ``step``, then metric name -> number. Writers append whole
lines with one ``write`` each (``toolkit.fsutil.append_jsonl``), so two processes never interleave; a writer killed
mid-line leaves a torn last line, which every reader here skips. A resumed or requeued run trains some steps again
but records each (role, step) once: writers ask :func:`recorded_steps` first.

Readers: :func:`records` (the whole file), :func:`tail` (the newest lines only, for status and the launcher's
ending), :class:`Follower` (lines as they are appended, for the launcher's progress line and the orchestrator's
stop checks).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

TRAINER = "trainer"
ORCHESTRATOR = "orchestrator"
REWARD_MEAN = "reward/all/mean"
"""The orchestrator's mean reward of a step's batch (0-1 for most tasksets)."""
EVAL_POLICY_VERSION = "eval/policy_version"
"""On the orchestrator's line of each held-out eval: the policy version the eval measured."""
STDERR_SUFFIX = "/stderr"
"""Appended to an eval score's name for its standard error (``eval/<env>/avg@4/stderr``)."""
TAIL_BYTES = 256 * 1024
"""How much of the file's end :func:`tail` reads: far more than one step's lines of every role."""


def _parse(line: str | bytes) -> dict[str, Any] | None:
    try:
        rec = json.loads(line)
    except ValueError:  # a torn line of a killed writer (or the cut first line of a tail)
        return None
    return rec if isinstance(rec, dict) else None


def is_eval_score(name: str) -> bool:
    """Whether ``name`` is a held-out eval score, ``eval/<env>/<score>@<k>`` (avg@4, pass@4, ...): not its standard
    error, nor the eval's bookkeeping (``eval/policy_version``, ``eval/<env>/examples``, ``eval/<env>/errored``)."""
    parts = name.split("/")
    if len(parts) < 3 or parts[0] != "eval":
        return False
    score, _, k = parts[-1].partition("@")
    return bool(score) and k.isdigit()


def records(path: Path) -> Iterator[dict[str, Any]]:
    """Every well-formed line of ``path`` in file order; nothing when the file does not exist."""
    if not Path(path).exists():
        return
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.strip() and (rec := _parse(line)) is not None:
                yield rec


def tail(path: Path, max_bytes: int = TAIL_BYTES) -> list[dict[str, Any]]:
    """The well-formed lines among the last ``max_bytes`` of ``path``, oldest first; [] when unreadable."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max_bytes))
            data = f.read()
    except OSError:
        return []
    return [rec for line in data.splitlines() if (rec := _parse(line)) is not None]


def recorded_steps(path: Path, role: str) -> set[int]:
    """Steps that already have a line of ``role`` in ``path``."""
    return {r["step"] for r in records(path) if r.get("role") == role and isinstance(r.get("step"), int)}


def recorded_eval_steps(path: Path) -> set[int]:
    """Steps that already have an orchestrator line of a held-out eval (one holding ``EVAL_POLICY_VERSION``)."""
    return {
        r["step"]
        for r in records(path)
        if r.get("role") == ORCHESTRATOR and EVAL_POLICY_VERSION in r and isinstance(r.get("step"), int)
    }


def newest_step(path: Path, role: str = TRAINER) -> int | None:
    """The newest ``step`` of ``role`` among the file's last lines (:func:`tail`), None without one."""
    for rec in reversed(tail(path)):
        if rec.get("role") == role and isinstance(rec.get("step"), int):
            return rec["step"]
    return None


class Follower:
    """Reads the lines appended to ``path`` since the last call, complete lines only (a line still being written
    is read on a later call)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.offset = 0

    def new(self) -> list[dict[str, Any]]:
        """The well-formed lines appended since the previous call (in order); [] when there are none yet."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        return [rec for line in complete.splitlines() if (rec := _parse(line)) is not None]
