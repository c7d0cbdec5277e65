"""Route a prepared run to its launcher: the local process supervisor or Slurm submission.

Data flows one way: config -> plan (``toolkit.placement``) -> render/launch. The plan is written to
``<run>/launcher/placement.json`` on every launch, dry-runs included, so every role and offline tool reads the
same ports and placement.
"""

from __future__ import annotations

import json
from typing import Any

from ..config.model import RLConfig
from ..config.site import SiteConfig
from ..run.layout import RunDir


def local_plan(cfg: RLConfig, site: Any, run: RunDir, *, probe: bool = True, tries: int = 64,
               roles: tuple[str, ...] | None = None) -> Any:
    """Plan for the local site with a port block no other process on this machine uses.

    Slurm jobs get distinct ports from their job ids; local runs have none, so the block is keyed by the run id
    and, when ``probe`` is set, moved on until every port is free. Without this a second local run would talk to
    the first run's engine on the same port. Raises RuntimeError when no free block is found.
    """
    from ..placement.plan import ROLES, build_plan
    from ..placement.ports import ports_free

    run_id = json.loads(run.run_meta.read_text())["run_id"] if run.run_meta.exists() else run.root.name
    for i in range(tries):
        plan = build_plan(cfg, site, run, job_id=f"local-{run_id}-{i}", roles=roles or ROLES)
        if not probe or ports_free(plan.ports.values(), "127.0.0.1"):
            return plan
    raise RuntimeError(f"no free port block in the site's range after {tries} tries; is the range too small?")


def check_local_model(cfg: RLConfig) -> None:
    """Raise ConfigError (field model.name) when a local run's model cannot be resolved now.

    The login checks only warn about an SFT run directory without its final model (a Slurm job may queue
    behind that run), but a local run starts at once and would end in a traceback from the launcher.
    """
    from ..config.errors import ConfigError, ConfigIssue
    from ..models import resolve_model

    try:
        resolve_model(cfg.model.name)
    except (FileNotFoundError, ValueError) as e:
        raise ConfigError([ConfigIssue("model.name", str(e))]) from None


def launch(cfg: RLConfig, run: RunDir, *, attempt: int, dry_run: bool, resume: bool,
           site: SiteConfig | None = None, roles: tuple[str, ...] | None = None,
           dependency: str | None = None) -> int:
    """Plan, then launch locally or submit. Returns the process exit status for ``srl rl``. ``site``: the one
    preflight loaded (read again by name when not given). ``roles``: the roles to place (default all; an SFT
    run places only the trainer). ``dependency`` (Slurm, e.g. ``afterok:123``) queues the job behind another.
    Returns 0 after a submission; the job id is printed and recorded in ``launcher/``."""
    from ..placement.plan import ROLES, build_plan, run_port_key, write_plan
    from ..preflight.site import load_site

    site = site or load_site(cfg.site)
    if site.is_slurm:
        from .submit import render_job, submit_job

        # Ports and roles are decided here, once: a dry run writes the plan the submitted job then uses.
        plan = build_plan(cfg, site, run, job_id="$SLURM_JOB_ID", port_key=run_port_key(cfg), roles=roles or ROLES)
        write_plan(run, plan)
        if dry_run:
            script = render_job(cfg, run, plan)
            print(f"dry run: resolved configs in {run.latest_configs}/resolved, sbatch script {script}")
            return 0
        job_id = submit_job(cfg, run, attempt, site=site, plan=plan, roles=roles, dependency=dependency)
        print(f"submitted job {job_id}; run directory {run.root}; follow with: srl logs {run.root} --follow")
        return 0
    if not dry_run:
        check_local_model(cfg)
    plan = local_plan(cfg, site, run, probe=not dry_run, roles=roles)
    write_plan(run, plan)
    if dry_run:
        print(f"dry run: resolved configs in {run.latest_configs}/resolved; placement {run.placement_file}")
        return 0
    from .local import run_local
    from .progress import wandb_sync_command

    rc = run_local(cfg, run, plan, attempt=attempt)
    sync = wandb_sync_command(run)
    if sync:
        print(f"srl: W&B files saved offline; upload with: {sync}", flush=True)
        from ..run import ending

        end = ending.read(run)
        if end is not None:
            print(end.line(), flush=True)  # how the run ended stays the last line
    return rc
