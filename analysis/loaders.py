"""Offline loaders: a run directory's ``metrics.jsonl``, resolved config, run meta and rollout store as pandas.

Every path comes from :class:`toolkit.run.layout.RunDir`. Nothing here imports torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from toolkit import fsutil
from toolkit.run.layout import RunDir
from toolkit.run.store import load_rollouts

KEY_COLUMNS = ("role", "step", "time")


def load_metrics(run_dir: Path | RunDir) -> pd.DataFrame:
    """Read ``<run>/metrics.jsonl`` into one row per (role, step), sorted by role then step.

    Each line is a JSON object with ``step``, ``time`` (unix seconds), ``role`` ("trainer", "orchestrator", ...)
    and metric values, either flat (``"reward/all/mean": 0.4``) or nested under ``"metrics"``. When a (role, step)
    appears more than once (a resumed or requeued run repeats steps; eval metrics are logged on their own line),
    the lines are merged and, per metric, the later line's value wins. A line that is not
    valid JSON (a writer killed mid-line, bytes that are not UTF-8) is skipped; the count is in
    ``df.attrs["skipped_lines"]``. Returns an empty frame with the key columns when the file is missing or empty
    (or something other than a file stands in its place).
    """
    path = _rundir(run_dir).metrics
    records: list[dict[str, Any]] = []
    skipped = 0
    if path.is_file():
        # Undecodable bytes become U+FFFD, so a garbage line fails json.loads and is counted like a torn one.
        with open(path, encoding="utf-8", errors="replace") as f:
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
    obj = fsutil.read_json(path)
    return obj if isinstance(obj, dict) else {}


@dataclass
class RunData:
    """Everything offline tools read from one run directory.

    ``rollouts`` is the store without token columns (None when the run has no store or it cannot be read);
    ``config`` is the resolved ``rl.json`` of the latest attempt ({} when absent); ``meta`` is ``run_meta.json``
    ({} when absent); ``problems`` says, per run file that exists but cannot be read, which file and why.
    """

    run: RunDir
    name: str
    meta: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    metrics: pd.DataFrame = field(default_factory=pd.DataFrame)
    rollouts: pd.DataFrame | None = None
    problems: list[str] = field(default_factory=list)


def load_run(run_dir: Path | RunDir, *, rollout_columns: list[str] | None = None) -> RunData:
    """Load the metrics, store, resolved config and run meta of one run directory.

    ``rollout_columns`` limits the store columns read (default all, tokens never). Raises ``FileNotFoundError``
    when ``run_dir`` is not a run directory (see :func:`require_run_dir`).
    """
    run = require_run_dir(run_dir)
    rollouts, problem = read_store(run, rollout_columns)
    return RunData(
        problems=[problem] if problem else [],
        run=run,
        name=run.root.name,
        meta=read_json(run.run_meta),
        config=read_json(run.resolved("rl")),
        metrics=load_metrics(run),
        rollouts=rollouts,
    )


def require_run_dir(run_dir: Path | RunDir) -> RunDir:
    """The ``RunDir`` of ``run_dir``. Raises ``FileNotFoundError`` with a one-line message when the path does not
    exist, is not a directory, or holds none of a run's files (configs/, logs/, launcher/, metrics.jsonl,
    run_meta.json, the rollout store): offline tools must not report "no failures" on, or write reports into, a
    directory that is no run."""
    run = _rundir(run_dir)
    if not run.root.exists():
        raise FileNotFoundError(f"run directory {run.root} does not exist")
    if not run.root.is_dir():
        raise FileNotFoundError(f"{run.root} is not a directory; give the run directory `srl rl` printed")
    if not any(p.exists() for p in (run.configs, run.logs, run.launcher, run.metrics, run.run_meta, run.rollout_store)):
        raise FileNotFoundError(
            f"{run.root} is not a run directory (no configs/, logs/, launcher/, metrics.jsonl, run_meta.json or "
            "rollout store); "
            "give the run directory `srl rl` printed, or a sweep root"
        )
    return run


def read_store(run: RunDir, columns: list[str] | None = None) -> tuple[pd.DataFrame | None, str | None]:
    """``(rollouts, problem)``: the rollout store's columns (None when the run has none) and, when the file exists
    but cannot be read (torn by a full disk, overwritten), ``problem`` naming the file and the reader's error, with
    rollouts None, so a report or diagnosis of exactly such a run still comes out."""
    if not run.rollout_store.exists():
        return None, None
    try:
        return load_rollouts(run.rollout_store, columns), None
    except (OSError, KeyError, ValueError) as exc:  # h5py raises OSError for a file that is not HDF5
        return None, f"rollout store {run.rollout_store} cannot be read ({exc})"


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
