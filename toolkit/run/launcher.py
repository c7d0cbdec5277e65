"""The local launcher record ``launcher/local.json``: which process runs a local run's attempt, and how it ended.

Written by the local launcher when an attempt starts (pid, host, attempt, start time) and again when it exits (the
same fields plus end time and exit status); read by ``srl status``, reports and ``srl diagnose``. A Slurm run has
no such record (Slurm knows its jobs).
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from toolkit.fsutil import atomic_write_json, read_json
from toolkit.run.layout import RunDir

# The types of the fields srl writes that readers use (a record of another shape reads as unreadable).
_TYPES = {"pid": int, "host": str, "attempt": int}


def write_local_record(run: RunDir, *, attempt: int, status: int | None = None) -> None:
    """Record the local launcher of ``attempt`` (this process); with ``status`` set, record that it ended."""
    rec: dict[str, Any] = {"pid": os.getpid(), "host": socket.gethostname(), "attempt": attempt}
    if status is None:
        rec["started"] = time.time()
    else:
        rec = {**rec, **(read_local_record(run) or {}), "ended": time.time(), "status": status}
    atomic_write_json(run.local_record, rec)


def read_local_record(run: RunDir) -> dict[str, Any] | None:
    """The local launcher record (``write_local_record``), None when there is none or it is unreadable (not JSON,
    or a pid, host or attempt of the wrong type: a hand-edited or damaged file)."""
    rec = read_json(run.local_record)
    typed = isinstance(rec, dict) and all(
        isinstance(rec[k], t) and not isinstance(rec[k], bool) for k, t in _TYPES.items() if k in rec
    )
    return rec if typed else None
