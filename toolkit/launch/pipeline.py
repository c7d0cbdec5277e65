"""The one launch pipeline: every command that starts work (``srl rl``, ``srl sft``, ``srl sft chain``,
``srl inference``, a local sweep point, the first-run gate's Slurm job) goes through :func:`start`.

    preflight (checks, and the placement plan, built once for the directory the launch writes)
      -> the command's own refusals (``before_prepare``)
      -> the run directory of a new attempt (:func:`toolkit.launch.prepare.prepare_attempt`)
      -> the command's own files (``after_prepare``)
      -> the plan written; a dry run renders and stops; Slurm submits; a local run is supervised here

Nothing is written before preflight and the command's refusals passed, so a bad config costs no queue wait and
leaves no directory. A new verb is a small module that fills a :class:`Launch` and calls :func:`start`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

from ..config import ConfigError, ConfigIssue, LoadedConfig, RLConfig
from ..placement.plan import Plan, roles_of, teacher_process, write_plan
from ..preflight import Preflight, preflight
from ..run.layout import RunDir
from .prepare import launch_target, prepare_attempt


@dataclass
class Launch:
    """What a command asks to start."""

    loaded: LoadedConfig
    """The config to launch (an SFT run: its launch view, :func:`toolkit.config.sft.launch_loaded`)."""
    live: RunDir
    """The run directory the config names (:func:`toolkit.launch.prepare.run_dir_for`); a dry run of an existing
    run writes to its shadow instead (:func:`toolkit.launch.prepare.launch_target`)."""
    argv: list[str]
    """The command line, recorded in the attempt's configs."""
    dry_run: bool = False
    resume: bool = False
    clean: bool = False
    kind: str = "rl"
    """``"rl"`` (an RL or SFT run), ``"inference"`` (a standalone deployment: engines and router) or ``"eval"``
    (the first-run gate's job: :mod:`toolkit.evalgate`; the command prints its own lines)."""
    roles: tuple[str, ...] | None = None
    """The roles to place; default every role of ``kind`` (an SFT run passes the trainer only)."""
    dependency: str | None = None
    """Slurm only: queue the job behind another (``afterok:<id>``)."""
    start_estimates: bool = True
    """A Slurm dry run of an RL run prints Slurm's start estimate for its shape and smaller ones
    (:mod:`toolkit.launch.queue`); off when the command printed them already (``--start-soonest``)."""

    @property
    def placed_roles(self) -> tuple[str, ...]:
        return self.roles or roles_of(self.kind)


@dataclass
class Started:
    """What :func:`start` did: ``status`` is the command's exit status (0 after a submission or a dry run; a local
    run's ending status otherwise); ``job_id`` the Slurm job id of a submission, else None."""

    status: int
    run: RunDir
    attempt: int
    job_id: str | None = None


def print_findings(checked: Preflight, warnings: list[ConfigIssue] | None = None) -> None:
    """Print preflight's notes and warnings to stderr, one per line (``warnings``: these instead of the checked
    config's, e.g. renamed to an SFT config's fields)."""
    for n in checked.notices:
        print(f"note: {n}", file=sys.stderr)
    for w in checked.warnings if warnings is None else warnings:
        print(f"warning: {w}", file=sys.stderr)


def checked_and_printed(loaded: LoadedConfig, *, run: RunDir, roles: tuple[str, ...], probe: bool) -> Preflight:
    """:func:`toolkit.preflight.preflight`, then its notes and warnings printed: the default check of :func:`start`."""
    checked = preflight(loaded, run=run, roles=roles, probe=probe)
    print_findings(checked)
    return checked


def check_local_model(cfg: RLConfig) -> None:
    """Raise ConfigError (field model.name, or a served teacher's name) when a local run's model, or a teacher it
    serves, is not there now.

    The login checks only warn about an SFT run directory without its final model, or a teacher directory without
    its config.json (a Slurm job may queue behind the run that writes it), but a local run starts at once and would
    end in a traceback from the launcher or an engine that never starts.
    """
    from pathlib import Path

    from ..models import resolve_model

    try:
        resolve_model(cfg.model.name)
    except (FileNotFoundError, ValueError) as e:
        raise ConfigError([ConfigIssue("model.name", str(e))]) from None
    missing = [
        ConfigIssue(f"{field}.teacher.name", f"{t.name} is not a model directory (no config.json there)")
        for field, _env, algo in cfg.orchestrator.distilling_envs()
        if (t := algo.teacher) is not None and t.serve and not (Path(t.name) / "config.json").is_file()
    ]
    if missing:
        raise ConfigError(missing)


Check = Callable[..., Preflight]


def start(
    req: Launch,
    *,
    check: Check = checked_and_printed,
    before_prepare: Callable[[Preflight], None] | None = None,
    after_prepare: Callable[[RunDir, int], None] | None = None,
) -> Started:
    """Check, prepare and launch ``req`` (module docstring). ``check`` replaces the default preflight-and-print
    (an SFT run names its findings in SFT terms); ``before_prepare`` refuses what only the command knows (a
    finished run resumed) and ``after_prepare`` writes the command's own files into the new attempt.

    Raises ConfigError (nothing written), SubmitError (sbatch refused; the attempt is marked as launching nothing),
    RenderError.
    """
    target = launch_target(req.live, dry_run=req.dry_run, resume=req.resume, clean=req.clean)
    checked = check(req.loaded, run=target, roles=req.placed_roles, probe=not req.dry_run)
    if checked.plan is None:  # preflight reports why as an error; this is a guard, not a path
        raise RuntimeError("preflight passed without a placement plan")
    if before_prepare is not None:
        before_prepare(checked)
    if not req.dry_run and not checked.site.is_slurm:
        check_local_model(checked.config)
    run, attempt = prepare_attempt(
        checked.loaded, req.live, argv=req.argv, dry_run=req.dry_run, resume=req.resume, clean=req.clean
    )
    if run.root != target.root:
        raise RuntimeError(f"prepared {run.root}, but the plan was built for {target.root}")
    if after_prepare is not None:
        after_prepare(run, attempt)
    return _launch(req, checked, run, attempt)


def _teacher_lines(cfg: RLConfig, plan: Plan) -> list[str]:
    """What a dry run says about each distilling env's teacher (an engine of the plan, a deployment or endpoint
    outside it, or the policy's own engines)."""
    o = cfg.orchestrator
    out = []
    for _field, env, algo in o.distilling_envs() if o.training_mode == "rl" else []:
        t = algo.teacher
        if t is None:  # opsd
            where = f"the policy itself on its engines, shown the task field {algo.demo_key!r}"
        elif t.serve:
            spec = plan.process(teacher_process(o.served_teacher_index(t.name)))
            gpus = f", GPUs {list(spec.gpus)}" if spec.gpus else ""
            gpus += f", its own het group {spec.het_group}" if spec.het_group else ""
            where = (
                f"{t.name}, served in this run by {spec.name} (node {spec.node_index}, port {spec.ports['http']}"
                f"{gpus}; log {spec.log_name}); started and stopped with the run, never trained"
            )
        else:
            where = f"the srl inference deployment {t.deployment}" if t.deployment else f"{t.name} at {t.base_url}"
            where += "; the run waits for it and never changes its weights"
        out.append(f"dry run: env {env.env_name} distils ({algo.type}) from {where}")
    return out


def _cost_line(cfg: RLConfig, plan: Plan) -> str:
    """The Slurm job's cost envelope (:mod:`toolkit.placement.cost`) for ``slurm.time``."""
    from ..config.slurm_time import parse_slurm_time
    from ..placement.cost import cost_envelope

    line = cost_envelope(plan, parse_slurm_time(cfg.slurm.time)).line()
    elastic = getattr(cfg.deployment, "elastic", None)
    if elastic is not None and elastic.replicas:
        line += (
            f"; plus {elastic.replicas} elastic replica job(s), each its own allocation of up to "
            f"{elastic.time} (deployment.elastic)"
        )
    return line


def _launch(req: Launch, checked: Preflight, run: RunDir, attempt: int) -> Started:
    cfg, site, plan = checked.config, checked.site, checked.plan
    write_plan(run, plan)
    if req.dry_run and req.kind == "rl":
        for line in _teacher_lines(cfg, plan):
            print(line)
    if site.is_slurm:
        from .submit import render_job, submit_job

        print(_cost_line(cfg, plan))
        if req.dry_run:
            script = render_job(cfg, run, plan, req.kind, attempt=attempt, site=site)
            print(f"dry run: resolved configs in {run.latest_configs}/resolved, sbatch script {script}")
            if req.kind == "rl" and req.start_estimates:
                from .queue import estimates, print_estimates

                print_estimates(estimates(cfg, site, run, roles=req.placed_roles, script=script))
            return Started(0, run, attempt)
        job_id = submit_job(
            cfg, run, attempt, req.kind, site=site, plan=plan, roles=req.placed_roles, dependency=req.dependency
        )
        if req.kind == "inference":
            print(f"submitted inference job {job_id}; ready file {run.inference_ready}; run directory {run.root}")
        elif req.kind == "rl":
            print(f"submitted job {job_id}; run directory {run.root}; follow with: srl logs {run.root} --follow")
        return Started(0, run, attempt, job_id)
    if req.dry_run:
        print(f"dry run: resolved configs in {run.latest_configs}/resolved; placement {run.placement_file}")
        return Started(0, run, attempt)
    from .local import run_local
    from .progress import wandb_sync_command

    if req.kind == "inference":
        print("srl: serving until Ctrl-C", flush=True)
    rc = run_local(cfg, run, plan, attempt=attempt)
    sync = wandb_sync_command(run)
    if sync:
        print(f"srl: W&B files saved offline; upload with: {sync}", flush=True)
        from ..run import ending

        end = ending.read(run)
        if end is not None:
            print(end.line(), flush=True)  # how the run ended stays the last line
    return Started(rc, run, attempt)
