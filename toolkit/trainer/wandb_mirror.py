"""``[monitors.wandb]``: every ``metrics.jsonl`` line of a run (trainer and orchestrator) in one W&B run.

One writer. The trainer's main rank mirrors the whole ``metrics.jsonl`` (its own lines and the orchestrator's) into
W&B, instead of each role logging for itself. Why: two processes can share a W&B run only in W&B's ``shared`` mode,
which is an online mode (wandb 0.31: ``Settings(mode="shared")`` excludes ``mode="offline"``); two offline writers
with one run id leave two offline directories whose histories collide on their step numbers when synced. Before
closing, the trainer's main rank waits until the orchestrator says it will write nothing more (its progress record
reaches the ``finished`` phase), because the orchestrator writes last: its line of step n follows batch n, and its
eval of the final policy follows the trainer's last step.
Mirroring the file also makes W&B hold exactly what ``metrics.jsonl`` holds, resumes included (each step is written
there once).

In W&B each key is ``<role>/<metrics.jsonl key>`` (``trainer/loss/mean``, ``orchestrator/reward/all/mean``,
``orchestrator/eval/<env>/avg@4``; both roles write ``time/step``), plotted against ``<role>/step``. The W&B step
is the line's index in ``metrics.jsonl``: increasing, and the same in every attempt, so a resumed run continues the
same W&B run (id = the srl run id of ``run_meta.json``) without repeating or dropping a line. Which lines are
mirrored already is kept in ``<run>/wandb/srl-mirror.json``.

Offline by default (compute nodes often have no internet): the W&B files stay in ``<run>/wandb/``, one
``offline-run-*`` directory per attempt, uploaded later with ``wandb sync``. Online mode reads the API key from the
environment variable named by ``api_key_var`` only, and passes it to wandb in memory (never ``wandb login``, which
writes it to ``~/.netrc``). A failing W&B never stops training: the mirror logs the error and turns itself off.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from toolkit import fsutil
from toolkit.run.layout import RunDir

log = logging.getLogger("srl.trainer.wandb")

ROLES = ("trainer", "orchestrator")
CURSOR_FILE = "srl-mirror.json"


def sweep_group(run: RunDir) -> str | None:
    """The sweep a run belongs to (its W&B group): the name in the sweep manifest of the run's parent directory
    (``srl sweep`` puts each point's run under ``<output_dir>/<sweep name>/``), else None."""
    data = fsutil.read_json(run.root.parent / "manifest.json")
    name = data.get("name") if isinstance(data, dict) else None
    return str(name) if name else None


class WandbMirror:
    """Mirrors new complete lines of ``run.metrics`` into one W&B run (see the module docstring)."""

    def __init__(self, run: RunDir, wb_run: Any, cursor: dict[str, int]) -> None:
        self.run = run
        self.wb_run = wb_run
        self.offset = int(cursor.get("offset", 0))
        self.lines = int(cursor.get("lines", 0))

    @classmethod
    def start(cls, run: RunDir, cfg: dict[str, Any]) -> WandbMirror | None:
        """Open (or continue) the run's W&B run; ``cfg`` is ``monitors.wandb`` as a dict (project, name, offline,
        api_key_var). Returns None, after logging why, when wandb is missing or fails to start."""
        try:
            import wandb
        except ImportError:
            log.error("monitors.wandb is set but wandb is not installed (pip install 'srl[train]'); not logging to W&B")
            return None
        meta = json.loads(run.run_meta.read_text()) if run.run_meta.is_file() else {}
        run_id = str(meta.get("run_id") or run.root.name)
        offline = bool(cfg.get("offline", True))
        key = None
        if not offline:
            var = cfg.get("api_key_var") or "WANDB_API_KEY"
            key = os.environ.get(var)
            if not key:
                log.error("monitors.wandb.offline = false but $%s is not set: logging offline instead", var)
                offline = True
        directory = run.wandb
        directory.mkdir(parents=True, exist_ok=True)
        settings: dict[str, Any] = {
            "console": "off",
            "x_disable_stats": True,
            "save_code": False,
            "disable_git": True,
            "silent": True,
        }
        if key:
            settings["api_key"] = key
        try:
            wb_run = wandb.init(
                project=cfg.get("project") or "srl",
                name=cfg.get("name") or run.root.name,
                id=run_id,
                group=sweep_group(run),
                dir=str(run.root),
                mode="offline" if offline else "online",
                resume="allow",
                config=_run_config(run),
                settings=wandb.Settings(**settings),
            )
            for role in ROLES:
                wb_run.define_metric(f"{role}/step")
                wb_run.define_metric(f"{role}/*", step_metric=f"{role}/step")
        except Exception:
            log.exception("W&B did not start; not logging to W&B (training goes on)")
            return None
        cursor = fsutil.read_json(directory / CURSOR_FILE) or {}
        log.info(
            "logging metrics to W&B run %s (%s; files in %s)", run_id, "offline" if offline else "online", directory
        )
        mirror = cls(run, wb_run, cursor)
        mirror.pump()
        return mirror

    def pump(self) -> int:
        """Log every complete line added to ``metrics.jsonl`` since the last call; returns how many."""
        if self.wb_run is None:
            return 0
        try:
            with open(self.run.metrics, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return 0
        end = data.rfind(b"\n")
        if end < 0:
            return 0  # nothing, or a line still being written
        n = 0
        try:
            for raw in data[: end + 1].splitlines():
                index = self.lines
                self.lines += 1
                try:
                    line = json.loads(raw)
                except ValueError:
                    continue  # a torn line of a killed writer: the file's readers skip it too
                if not isinstance(line, dict):
                    continue
                role = str(line.get("role", "unknown"))
                row = {f"{role}/{k}": v for k, v in line.items() if k != "role"}
                self.wb_run.log(row, step=index)
                n += 1
        except Exception:
            log.exception("logging to W&B failed; not logging to W&B any more (training goes on)")
            self.wb_run = None
            return n
        finally:
            self.offset += end + 1
            fsutil.atomic_write_json(self.run.wandb / CURSOR_FILE, {"offset": self.offset, "lines": self.lines})
        return n

    def close(self) -> Path | None:
        """Mirror the last lines and finish the W&B run. Callers first wait for the orchestrator to finish writing
        (:func:`toolkit.run.heartbeat.wait_until_finished`). Returns the offline directory of this attempt (None
        online or when W&B was off)."""
        if self.wb_run is None:
            return None
        self.pump()
        if self.wb_run is None:
            return None
        wb_run, self.wb_run = self.wb_run, None
        offline = wb_run.settings.mode == "offline" or getattr(wb_run.settings, "_offline", False)
        sync_dir = Path(wb_run.settings.sync_dir) if offline else None
        try:
            wb_run.finish()
        except Exception:
            log.exception("finishing the W&B run failed")
        if sync_dir is not None:
            log.info("W&B files of this attempt: %s; upload with: wandb sync %s", sync_dir, sync_dir)
        return sync_dir


def _run_config(run: RunDir) -> dict[str, Any]:
    """The run's resolved config for W&B's config panel, without ``env_vars`` (values a user may not want to
    publish; secrets belong in ``slurm.secret_env_vars``, by name, but nothing forces that)."""
    cfg = fsutil.read_json(run.run_config()) or {}
    cfg.pop("env_vars", None)
    return cfg
