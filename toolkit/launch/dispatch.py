"""Route a prepared run to its launcher: the local process supervisor or Slurm submission.

Data flows one way: config -> plan (``toolkit.placement``) -> render/launch. The plan is written to
``<run>/launcher/placement.json`` on every launch, dry-runs included, so every role and offline tool reads the
same ports and placement.
"""

from __future__ import annotations

from ..config.model import RLConfig
from ..rundir import RunDir


def launch(cfg: RLConfig, run: RunDir, *, attempt: int, dry_run: bool, resume: bool) -> int:
    """Plan, then launch locally or submit. Returns the process exit status for ``srl rl``."""
    from ..config.site import load_site
    from ..placement.plan import build_plan, write_plan

    site = load_site(cfg.site)
    plan = build_plan(cfg, site, run, job_id="local" if not site.is_slurm else "$SLURM_JOB_ID")
    write_plan(run, plan)
    if site.is_slurm:
        from .submit import render_rl, submit_rl

        if dry_run:
            script = render_rl(cfg, run, plan)
            print(f"dry run: resolved configs in {run.latest_configs}/resolved, sbatch script {script}")
            return 0
        job_id = submit_rl(cfg, run, attempt)
        print(f"submitted job {job_id}; run directory {run.root}; follow with: srl logs {run.root} --follow")
        return 0
    if dry_run:
        print(f"dry run: resolved configs in {run.latest_configs}/resolved; placement {run.placement_file}")
        return 0
    from .local import run_local

    return run_local(cfg, run, plan, attempt=attempt)
