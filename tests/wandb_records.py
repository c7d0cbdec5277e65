"""Reading a run's offline W&B files back with W&B's own reader (``wandb leet inspect --json``), for the tests.

``wandb leet inspect --json FILE`` prints each record of a ``run-<id>.wandb`` transaction log as one JSON line;
the ``run`` record carries the run id, group and name, each ``history`` record one ``wandb.log`` row
(``history.item``: key -> value, plus W&B's ``_step``, ``_runtime``, ``_timestamp``).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

WANDB = Path(sys.executable).with_name("wandb")


def read_offline_run(offline_dir: Path) -> tuple[dict, list[dict]]:
    """``(run record, history rows)`` of one ``offline-run-*`` directory; each row is its ``history.item``."""
    (log,) = Path(offline_dir).glob("run-*.wandb")
    out = subprocess.run(
        [str(WANDB), "leet", "inspect", "--json", str(log)], capture_output=True, text=True, timeout=120, check=True
    )
    run, rows = {}, []
    for line in out.stdout.splitlines():
        rec = json.loads(line)
        if rec.get("type") == "run":
            run = rec["run"]
        elif rec.get("type") == "history":
            rows.append(rec["history"]["item"])
    return run, rows


def unprefixed(row: dict) -> dict:
    """A W&B row written by the mirror as the ``metrics.jsonl`` line it came from (role put back, W&B keys out)."""
    (role,) = {k.split("/", 1)[0] for k in row if not k.startswith("_")}
    line = {k.split("/", 1)[1]: v for k, v in row.items() if not k.startswith("_")}
    line["role"] = role
    return line


def same_values(a: dict, b: dict) -> bool:
    """Equal dicts, numbers compared as floats (W&B's JSON writes 1.0 as 1 and NaN as "NaN"; NaN equals NaN)."""
    if set(a) != set(b):
        return False
    for k, v in a.items():
        x, y = _number(v), _number(b[k])
        if isinstance(x, (int, float)) and isinstance(y, (int, float)) and not isinstance(x, bool):
            if not (float(x) == float(y) or (math.isnan(float(x)) and math.isnan(float(y)))):
                return False
        elif x != y:
            return False
    return True


def _number(v):
    # The reader prints non-finite floats as JSON strings.
    return float(v) if v in ("NaN", "Infinity", "-Infinity") else v
