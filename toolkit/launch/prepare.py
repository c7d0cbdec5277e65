"""Create (or re-open) a run directory and record what was asked: inputs, command line, resolved configs.

Written for every attempt under ``configs/attempt_<n>/`` with ``configs/latest`` pointing at it, so a run's history
of configs survives resumes and requeues. Nothing here launches anything; ``--dry-run`` stops after this.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import sys
import time
import uuid
from pathlib import Path

from ..config import LoadedConfig, role_view
from ..config.errors import ConfigError
from ..fsutil import atomic_write_json, atomic_write_text
from ..rundir import RunDir, point_symlink


def auto_run_name(loaded: LoadedConfig) -> str:
    """``<envs>--<model>--<short id>``: env names joined by ``+``, model basename, 6 hex chars."""
    cfg = loaded.config
    envs = "+".join(e.env_name for e in cfg.orchestrator.train.env) or "serve"
    model = Path(cfg.model.name).name or "model"
    raw = f"{envs}--{model}--{uuid.uuid4().hex[:6]}"
    return re.sub(r"[^A-Za-z0-9._+-]", "-", raw)[:120]


def run_dir_for(loaded: LoadedConfig, *, resume: bool = False) -> RunDir:
    """The RunDir the config points at. Without ``run.name``: a new auto name, or with ``resume`` the newest
    existing run whose auto name has the same ``<envs>--<model>--`` prefix (so "the same command plus --resume"
    continues the run it started)."""
    cfg = loaded.config
    if cfg.run.name is None:
        name = auto_run_name(loaded)
        if resume:
            prefix = name.rsplit("--", 1)[0] + "--"
            out = Path(cfg.output_dir)
            # Only runs that actually trained count: a dry run (configs, no metrics) is not something to resume.
            runs = sorted((p for p in out.glob(f"{prefix}*") if RunDir(p).configs.is_dir() and RunDir(p).metrics.exists()),
                          key=lambda p: RunDir(p).metrics.stat().st_mtime)  # fmt: skip
            if runs:
                name = runs[-1].name
                print(f"srl: --resume without run.name: continuing {runs[-1]} (the newest run of this config that "
                      "recorded metrics)", file=sys.stderr)
        cfg.run.name = name
    return RunDir(Path(cfg.output_dir) / cfg.run.name)


def dry_run_dir(live: RunDir) -> RunDir:
    """Where a dry run of an *existing* run writes its would-be configs, placement and scripts:
    ``<output_dir>/.dry-run/<name>/``, emptied first. A dry run must never touch a live run (its ``configs/latest``,
    ``placement.json`` and attempt numbers are read by running and requeued jobs), let alone delete it for
    ``--clean``. Paths inside the dry-run files refer to this directory, not to the live run."""
    shadow = RunDir(live.root.parent / ".dry-run" / live.root.name)
    shutil.rmtree(shadow.root, ignore_errors=True)
    return shadow


DRY_RUN_MARKER = "DRY_RUN"  # in configs/attempt_<n>/: that attempt was only a dry run (nothing was launched)


def only_dry_runs(run: RunDir) -> bool:
    """Whether every attempt of ``run`` was a dry run and it recorded no metrics: nothing ever ran in it, so a
    real run may take the directory over (a dry run first, then the same command without ``--dry-run``)."""
    attempts = run.attempts()
    return bool(attempts) and not run.metrics.exists() and all(
        (run.config_attempt(a) / DRY_RUN_MARKER).exists() for a in attempts
    )


def prepare_run(
    loaded: LoadedConfig,
    *,
    argv: list[str],
    resume: bool = False,
    clean: bool = False,
    run: RunDir | None = None,
    dry_run: bool = False,
) -> tuple[RunDir, int]:
    """Create the run directory for a new attempt and write its configs. Returns ``(run, attempt)``.

    ``run``: the directory to use instead of the one the config names (dry runs of existing runs). ``dry_run``
    marks the attempt as a dry run; a directory that only ever held dry runs is replaced by the next run
    (dry or not) without ``--resume``/``--clean``.
    Raises ConfigError when the directory exists and neither ``resume`` nor ``clean`` was given (nothing is
    touched then), or when ``resume`` is asked for a run that does not exist.
    """
    run = run or run_dir_for(loaded, resume=resume)
    exists = run.configs.exists()
    if exists and not resume and only_dry_runs(run):
        shutil.rmtree(run.root)  # only would-be configs, placement and scripts: nothing was launched from them
        exists = False
    if exists and not (resume or clean):
        raise ConfigError(
            f"run directory {run.root} already exists; pass --resume to continue it, --clean to delete it and "
            "start over, or set a different run.name"
        )
    if resume and not exists:
        raise ConfigError(f"--resume: no run at {run.root} (nothing to resume)")
    if clean and exists:
        shutil.rmtree(run.root)
    for d in (run.configs, run.launcher, run.logs, run.rollouts, run.broadcasts, run.checkpoints, run.store,
              run.control, run.reports):
        d.mkdir(parents=True, exist_ok=True)
    # A stale stop request from an earlier attempt would end the new one at once.
    if run.stop_request.exists():
        run.stop_request.unlink()
    attempt = run.next_attempt()
    adir = run.config_attempt(attempt)
    (adir / "inputs").mkdir(parents=True)
    (adir / "resolved").mkdir()
    for i, src in enumerate(loaded.inputs):
        shutil.copyfile(src, adir / "inputs" / f"{i:02d}-{Path(src).name}")
    atomic_write_text(adir / "command.txt", shlex.join(argv) + "\n")
    if dry_run:
        atomic_write_text(adir / DRY_RUN_MARKER, "srl --dry-run: nothing was launched from this attempt\n")
    cfg = loaded.config
    atomic_write_json(adir / "resolved" / "rl.json", cfg.model_dump(mode="json"))
    for role in ("trainer", "orchestrator", "inference"):
        atomic_write_json(adir / "resolved" / f"{role}.json", role_view(cfg, role))
    point_symlink(run.latest_configs, adir.name)
    if not run.run_meta.exists():
        atomic_write_json(run.run_meta, {"run_id": uuid.uuid4().hex, "created": time.time(), "name": cfg.run.name})
    return run, attempt


def read_run_meta(run: RunDir) -> dict:
    """The run's persistent metadata (run id kept across attempts and requeues)."""
    return json.loads(run.run_meta.read_text())
