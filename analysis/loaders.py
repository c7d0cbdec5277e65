"""Offline loaders: a run directory's ``metrics.jsonl``, resolved config, run meta and rollout store as pandas.

Every path comes from :class:`toolkit.run.layout.RunDir`. Nothing here imports torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from toolkit.run.layout import RunDir
from toolkit.run.store import load_rollouts

KEY_COLUMNS = ("role", "step", "time")


def load_metrics(run_dir: Path | RunDir) -> pd.DataFrame:
    """Read ``<run>/metrics.jsonl`` into one row per (role, step), sorted by role then step.

    Each line is a JSON object with ``step``, ``time`` (unix seconds), ``role`` ("trainer", "orchestrator", ...)
    and metric values, either flat (``"reward/all/mean": 0.4``) or nested under ``"metrics"``. When a (role, step)
    appears more than once (a resumed or requeued run repeats steps; eval metrics are logged on their own line),
    the lines are merged and, per metric, the later line's value wins. A line that is not
    valid JSON (a writer killed mid-line) is skipped; the count is in ``df.attrs["skipped_lines"]``.
    Returns an empty frame with the key columns when the file is missing or empty.
    """
    path = _rundir(run_dir).metrics
    records: list[dict[str, Any]] = []
    skipped = 0
    if path.exists():
        with open(path, encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError:
                    skipped += 1
                    continue
                if not isinstance(obj, dict) or "step" not in obj:
                    skipped += 1
                    continue
                nested = obj.pop("metrics", None)
                if isinstance(nested, dict):
                    obj.update(nested)
                obj.setdefault("role", "unknown")
                records.append(obj)
    if not records:
        df = pd.DataFrame({c: pd.Series(dtype="float64" if c != "role" else "object") for c in KEY_COLUMNS})
    else:
        df = pd.DataFrame.from_records(records)
        # Several lines may share a (role, step): the orchestrator logs eval metrics apart from the step's
        # metrics, and a resumed run logs a step again. Per column, the last non-null value wins.
        df = df.groupby(["role", "step"], sort=True).last().reset_index()
        ordered = [c for c in KEY_COLUMNS if c in df.columns]
        df = df[ordered + sorted(c for c in df.columns if c not in KEY_COLUMNS)]
    df.attrs["skipped_lines"] = skipped
    return df


def role_metrics(metrics: pd.DataFrame, role: str) -> pd.DataFrame:
    """Rows of one role indexed by step, with the columns that role actually wrote (all-NaN columns dropped)."""
    if "role" not in metrics.columns or metrics.empty:
        return pd.DataFrame()
    sub = metrics[metrics["role"] == role].drop(columns=["role"]).set_index("step").sort_index()
    return sub.dropna(axis=1, how="all")


def read_json(path: Path) -> dict[str, Any]:
    """JSON object at ``path``, or ``{}`` when it is missing or unreadable (reports must not die on a bad file)."""
    try:
        obj = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}
    return obj if isinstance(obj, dict) else {}


@dataclass
class RunData:
    """Everything offline tools read from one run directory.

    ``rollouts`` is the store without token columns (None when the run has no store); ``config`` is the resolved
    ``rl.json`` of the latest attempt ({} when absent); ``meta`` is ``run_meta.json`` ({} when absent).
    """

    run: RunDir
    name: str
    meta: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    metrics: pd.DataFrame = field(default_factory=pd.DataFrame)
    rollouts: pd.DataFrame | None = None


def load_run(run_dir: Path | RunDir, *, rollout_columns: list[str] | None = None) -> RunData:
    """Load the metrics, store, resolved config and run meta of one run directory.

    ``rollout_columns`` limits the store columns read (default all, tokens never). Raises ``FileNotFoundError``
    when ``run_dir`` is not a directory.
    """
    run = _rundir(run_dir)
    if not run.root.is_dir():
        raise FileNotFoundError(f"run directory {run.root} does not exist")
    rollouts = load_rollouts(run.rollout_store, rollout_columns) if run.rollout_store.exists() else None
    return RunData(
        run=run,
        name=run.root.name,
        meta=read_json(run.run_meta),
        config=read_json(run.resolved("rl")),
        metrics=load_metrics(run),
        rollouts=rollouts,
    )


def dotted(obj: dict[str, Any], path: str, default: Any = None) -> Any:
    """``obj["a"]["b"]`` for ``path`` "a.b"; ``default`` when any key is missing or not a mapping."""
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return default
        cur = cur[part]
    return cur


def _rundir(run_dir: Path | RunDir) -> RunDir:
    return run_dir if isinstance(run_dir, RunDir) else RunDir(Path(run_dir))
