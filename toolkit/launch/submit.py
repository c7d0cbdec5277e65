"""Submit an RL run (or an inference deployment) to Slurm: plan, render into ``<run>/launcher/``, ``sbatch``.

The job id is appended to ``<run>/launcher/job_ids.txt`` (one line per submission: job id, kind, attempt), which
``srl status``/``cancel``/``logs`` read. sbatch runs with an environment scrubbed of inherited ``SLURM_*``,
``SBATCH_*``, ``SRUN_*`` and ``SALLOC_*`` variables (``toolkit.launch.slurm.submit``); when it fails the error
carries sbatch's own stderr.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from .. import lease as leases
from ..config.model import RLConfig
from ..config.site import SiteConfig
from ..placement.plan import Plan, launch_plan, roles_of, write_plan
from ..preflight.site import load_site
from ..render import render_job
from ..run.layout import RunDir, point_symlink
from . import slurm
from .prepare import mark_not_launched


def record_job_id(run: RunDir, job_id: str, kind: str, attempt: int) -> None:
    """Append ``job_id kind attempt`` to the run's job id file (created if missing)."""
    run.launcher.mkdir(parents=True, exist_ok=True)
    with open(run.job_ids_file, "a", encoding="utf-8") as f:
        f.write(f"{job_id} {kind} {attempt}\n")


def read_job_ids(run: RunDir) -> list[tuple[str, str, int]]:
    """``(job_id, kind, attempt)`` per submission, oldest first; [] when nothing was submitted. An attempt that is
    not a number (a hand-edited or damaged line) reads as 0, unknown: the job id is still worth asking Slurm about,
    and one damaged run must not stop ``srl status`` from listing the others."""
    if not run.job_ids_file.exists():
        return []
    out = []
    for line in run.job_ids_file.read_text().splitlines():
        parts = line.split()
        if parts:
            attempt = parts[2] if len(parts) > 2 else "0"
            out.append((parts[0], parts[1] if len(parts) > 1 else "rl", int(attempt) if attempt.isdigit() else 0))
    return out


def hand_over(run: RunDir, attempt: int) -> None:
    """Before submitting ``attempt`` of ``run``: create its log directory (``logs/latest`` points at it) and
    release the run's lease, which this process held while it prepared the run; the job takes it when it starts."""
    run.log_attempt(attempt).mkdir(parents=True, exist_ok=True)
    point_symlink(run.latest_logs, run.log_attempt(attempt).name)
    mine = leases.held(run)
    if mine is not None:
        mine.release()


def nothing_queued(e: slurm.SlurmCommandError) -> bool:
    """Whether a failed ``sbatch`` certainly queued nothing: it exited non-zero, or could not start."""
    return (e.returncode is not None and e.returncode != 0) or e.what == "could not start"


def _undo_hand_over(run: RunDir, attempt: int) -> None:
    """After sbatch refused ``attempt``: remove the (empty) log directory :func:`hand_over` made for it and point
    ``logs/latest`` back at the attempt before, if any."""
    log_dir = run.log_attempt(attempt)
    try:
        log_dir.rmdir()  # only when empty: nothing wrote there
    except OSError:
        return
    if run.latest_logs.is_symlink() and os.readlink(run.latest_logs) == log_dir.name:
        earlier = sorted((p for p in run.logs.glob("attempt_*") if p.is_dir()), key=lambda p: p.stat().st_mtime)
        if earlier:
            point_symlink(run.latest_logs, earlier[-1].name)
        else:
            run.latest_logs.unlink()


def submit_job(
    cfg: RLConfig,
    run: RunDir,
    attempt: int,
    kind: str = "rl",
    *,
    site: SiteConfig | None = None,
    plan: Plan | None = None,
    dependency: str | None = None,
    roles: tuple[str, ...] | None = None,
) -> str:
    """Render ``<run>/launcher/<kind>.sbatch`` and submit it; returns the Slurm job id.

    ``kind``: ``"rl"`` (an RL or SFT run), ``"eval"`` (the first-run gate) or ``"inference"`` (an inference-only
    deployment, engines + router, that publishes ``control/inference_ready.json`` for RL or eval jobs started with
    ``inference.external = <this run dir>``). ``plan``: the one preflight built (:mod:`toolkit.launch.pipeline`);
    without it (a test or a library caller) :func:`launch_plan` builds it here. The job fills in its id and hosts
    when it starts. ``dependency`` (e.g. ``"afterok:123"``) chains this job after another. ``roles`` restricts the
    job (default: every role of ``kind``; an SFT run: the trainer only). Raises ``toolkit.launch.slurm.SubmitError``
    with sbatch's stderr (the attempt is then marked as having launched nothing), ``RenderError`` for unsafe values.
    """
    roles = roles or roles_of(kind)
    site = site or load_site(cfg.site)
    if not site.is_slurm:
        raise ValueError(f"site '{site.name}' has no Slurm; use the local launcher")
    if plan is None:
        plan = launch_plan(cfg, site, run, roles=roles)
        write_plan(run, plan)
    script = render_job(cfg, run, plan, kind, attempt=attempt, site=site)
    hand_over(run, attempt)
    extra = [f"--dependency={dependency}", "--kill-on-invalid-dep=yes"] if dependency else []
    try:
        job_id = slurm.submit(script, extra_args=extra, cwd=str(run.root))
    except slurm.SlurmCommandError as e:
        # sbatch exited non-zero or never started: nothing was queued, so the attempt launched nothing, like a dry
        # run, and the same command may take the directory over once Slurm accepts jobs. A timeout or an answer
        # without a job id may have queued it: the attempt is left as it is (the user checks squeue).
        if nothing_queued(e):
            _undo_hand_over(run, attempt)
            mark_not_launched(run, attempt, "sbatch did not accept the job")
        raise
    record_job_id(run, job_id, kind, attempt)
    print(f"submitted {kind} job {job_id} (site {site.name})", file=sys.stderr)
    print(f"  script:    {script}", file=sys.stderr)
    print(f"  placement: {run.placement_file}", file=sys.stderr)
    out_log = f"{cfg.slurm.job_name or cfg.run.name}-{job_id}.out"
    print(
        f"  logs:      {run.logs}/ ({out_log} and {Path(run.log_attempt(attempt)).name}/)",
        file=sys.stderr,
    )
    print(f"  status:    srl status {run.root}", file=sys.stderr)
    return job_id
