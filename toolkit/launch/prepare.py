"""Create (or re-open) a run directory and record what was asked: inputs, command line, resolved configs.

Written for every attempt under ``configs/attempt_<n>/`` with ``configs/latest`` pointing at it, so a run's history
of configs survives resumes and requeues. Nothing here launches anything; ``--dry-run`` stops after this.

The first-run gate's files (``toolkit.evalgate``: its Slurm jobs' directory ``RunDir.gates`` and its verdicts in
``reports/``) belong to the config, not to a training attempt: a dry run, then the gate (training chained behind
it, the gate maybe still queued), then the run is the order a careful user takes, so a dry-run takeover and
``--clean`` keep them, and a gate's queued job is not a live job of the run.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
import time
import uuid
from pathlib import Path

from .. import lease as leases
from ..config import LoadedConfig
from ..config.errors import ConfigError
from ..fsutil import atomic_write_json, atomic_write_text
from ..run.layout import RunDir, point_symlink
from ..run.verdict import GATE_REPORT_FILES


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
            runs = sorted(
                (p for p in out.glob(f"{prefix}*") if RunDir(p).configs.is_dir() and RunDir(p).metrics.exists()),
                key=lambda p: RunDir(p).metrics.stat().st_mtime,
            )
            if runs:
                name = runs[-1].name
                print(
                    f"srl: --resume without run.name: continuing {runs[-1]} (the newest run of this config that "
                    "recorded metrics)",
                    file=sys.stderr,
                )
        cfg.run.name = name
    return RunDir(Path(cfg.output_dir) / cfg.run.name)


def launch_target(live: RunDir, *, dry_run: bool, resume: bool, clean: bool) -> RunDir:
    """The directory a launch of ``live`` writes, decided before anything is written (so preflight builds the plan
    for it): ``live`` itself, or for a dry run with ``--resume``/``--clean`` of an existing run its shadow
    ``<output_dir>/.dry-run/<name>/``. A dry run must never touch a live run (its ``configs/latest``,
    ``placement.json`` and attempt numbers are read by running and requeued jobs), let alone delete it for
    ``--clean``. Paths inside the dry-run files refer to the shadow, not to the live run."""
    if dry_run and live.configs.exists() and (resume or clean):
        return _shadow(live)
    return live


def _shadow(live: RunDir) -> RunDir:
    return RunDir(live.root.parent / ".dry-run" / live.root.name)


def dry_run_dir(live: RunDir) -> RunDir:
    """The shadow of the existing run ``live`` (:func:`launch_target`), emptied for a new dry run. Raises
    ConfigError when a batch script of an earlier dry run there was submitted by hand and its job is queued."""
    shadow = _shadow(live)
    if shadow.root.is_dir():  # an earlier dry run's batch script may have been submitted by hand and still wait
        _refuse_if_jobs_queued(shadow, remedy=f"cancel them (scancel) or delete {shadow.root} yourself")
    shutil.rmtree(shadow.root, ignore_errors=True)
    return shadow


DRY_RUN_MARKER = "DRY_RUN"  # in configs/attempt_<n>/: that attempt was only a dry run (nothing was launched)

# What a dry run leaves in a run directory, and nothing else. Anything outside this (metrics, policy reloads, job
# ids, an admin token, a local run's progress file, a log, a rollout, a broadcast, a checkpoint, a store, a STOP
# request or readiness file, scratch, a report, a user's own file) means something ran or someone put it there.
_DRY_ROOT_FILES = frozenset({"run_meta.json"})
_DRY_EMPTY_DIRS = ("logs", "rollouts", "broadcasts", "checkpoints", "store", "control", "reports")
# lease.json: the lease of the launch that is about to replace the dry runs (``toolkit.lease``).
_DRY_LAUNCHER_FILES = frozenset({"placement.json", "ports.json", "site.toml", "pre_run.sh", "lease.json"})
_ATTEMPT_NAME = re.compile(r"^attempt_[0-9]+$")


RESUME_CLEAN_MSG = "--resume and --clean contradict (continue the run, or delete it and start over): give one"


def prepare_attempt(
    loaded: LoadedConfig, live: RunDir, *, argv: list[str], dry_run: bool, resume: bool, clean: bool
) -> tuple[RunDir, int]:
    """``prepare_run`` for a command's flags: a dry run with ``--resume``/``--clean`` of the existing run ``live``
    writes its would-be files to :func:`dry_run_dir` and leaves ``live`` untouched (it may be running or serving);
    otherwise ``prepare_run`` on ``live``. Raises ConfigError as ``prepare_run`` (``--resume`` with ``--clean``
    included, whichever path)."""
    if resume and clean:
        raise ConfigError(RESUME_CLEAN_MSG)
    if launch_target(live, dry_run=dry_run, resume=resume, clean=clean) is not live:
        shadow = dry_run_dir(live)
        print(f"dry run of the existing run {live.root}: nothing in it is changed; would-be files go to {shadow.root}")
        return prepare_run(loaded, argv=argv, run=shadow, dry_run=True)
    return prepare_run(loaded, argv=argv, resume=resume, clean=clean, run=live, dry_run=dry_run)


def mark_not_launched(run: RunDir, attempt: int, why: str) -> None:
    """Record that ``attempt`` launched nothing (a dry run; an sbatch that refused the job), so a later command may
    take a directory of such attempts over (:func:`only_dry_runs`)."""
    atomic_write_text(run.config_attempt(attempt) / DRY_RUN_MARKER, f"{why}: nothing was launched from this attempt\n")


def only_dry_runs(run: RunDir) -> bool:
    """Whether ``run`` holds nothing but what dry runs write, so a real run may take the directory over (a dry run
    first, then the same command without ``--dry-run``).

    True only when every attempt under ``configs/`` carries the DRY_RUN marker, ``configs/latest`` points at one of
    them, the launcher holds only rendered files (placement, ports, site copy, batch scripts), the data-plane,
    log, control and report directories are empty, and the root holds nothing else. A dry run's batch script can
    be submitted by hand; the job's first log, rollout or control file then keeps the directory (while the job is
    still queued, the directory's files say nothing: ``_refuse_if_jobs_queued`` asks Slurm). Anything unexpected
    (a half-written attempt, a symlinked attempt, a file a user added) answers False: the caller then asks for
    ``--resume`` or ``--clean``, which is safe; a wrong True would delete a run. Never raises for odd contents.
    """
    try:
        return _only_dry_runs(run)
    except OSError:  # unreadable or vanishing entries: not provably dry
        return False


_TAKEOVER_REMEDY = (
    "cancel them (scancel), pass --resume to continue that run, --clean to replace the directory "
    "anyway, or set a different run.name"
)


def _refuse_if_jobs_queued(run: RunDir, remedy: str = _TAKEOVER_REMEDY) -> None:
    """Return when no Slurm job will write into ``run`` (a dry-run directory may then be taken over). Raise
    ConfigError naming the jobs when one is queued or running with its logs there (a dry run's batch script
    submitted by hand, not started yet), or when Slurm cannot be asked: taking the directory over would pull it
    from under that job."""
    from . import slurm

    if not any(run.launcher.glob("*.sbatch")):
        return  # the dry runs rendered no batch script (local backend): nothing can have been submitted
    try:
        jobs = slurm.jobs_logging_under(run.root, besides=run.gates)  # a gate's job is not a dry run's
    except slurm.SlurmCommandError as exc:
        raise ConfigError(
            f"run directory {run.root} holds only dry runs, but squeue could not say whether a job submitted from "
            f"one of them is queued ({exc}); {remedy}"
        ) from exc
    if jobs:
        raise ConfigError(
            f"run directory {run.root} holds only dry runs, but Slurm job(s) {', '.join(jobs)} submitted from it "
            f"are queued or running and will write into it; {remedy}"
        )


def _only_dry_runs(run: RunDir) -> bool:
    root = run.root
    if not root.is_dir():
        return False
    attempts: set[str] = set()
    for entry in os.scandir(run.configs):
        if entry.name == "latest":
            continue
        # A symlinked attempt (or any other entry) was not written by prepare_run: not provably a dry run.
        if not (_ATTEMPT_NAME.match(entry.name) and entry.is_dir(follow_symlinks=False)):
            return False
        if not (Path(entry.path) / DRY_RUN_MARKER).is_file():
            return False  # a launched attempt, or one whose writing stopped before the marker
        attempts.add(entry.name)
    if not attempts or not run.latest_configs.is_symlink() or os.readlink(run.latest_configs) not in attempts:
        return False
    for entry in os.scandir(root):
        name = entry.name
        if name == "configs":
            if entry.is_symlink():
                return False
        elif name == "launcher":
            if entry.is_symlink() or not entry.is_dir():
                return False
            for f in os.scandir(entry.path):
                if not (
                    f.is_file(follow_symlinks=False) and (f.name in _DRY_LAUNCHER_FILES or f.name.endswith(".sbatch"))
                ):
                    return False
        elif name == run.gates.name:
            if entry.is_symlink() or not entry.is_dir():
                return False
        elif name == "reports":
            if (
                entry.is_symlink()
                or not entry.is_dir()
                or any(f.name not in GATE_REPORT_FILES for f in os.scandir(entry))
            ):
                return False
        elif name in _DRY_EMPTY_DIRS:
            if entry.is_symlink() or not entry.is_dir() or any(os.scandir(entry.path)):
                return False
        elif not (name in _DRY_ROOT_FILES and entry.is_file(follow_symlinks=False)):
            return False
    return True


def _delete_run_dir(root: Path) -> None:
    """Empty a run directory but its first-run gate's files (``eval/`` and the verdicts in ``reports/``). The
    directory itself stays (a symlinked one, ``outputs/r1 -> /scratch/r1``, keeps its link); links inside are
    removed, never followed."""
    gates = RunDir(root).gates
    for entry in os.scandir(root):
        if entry.name == gates.name and entry.is_dir(follow_symlinks=False):
            continue
        if entry.name == "reports" and entry.is_dir(follow_symlinks=False):
            for f in os.scandir(entry.path):
                if f.is_dir(follow_symlinks=False):
                    shutil.rmtree(f.path)
                elif f.name not in GATE_REPORT_FILES:
                    os.unlink(f.path)
        elif entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path)
        else:
            os.unlink(entry.path)


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
    touched then), when ``resume`` is asked for a run that does not exist, or when both ``resume`` and ``clean`` are
    given (continue it or delete it: the two contradict, and deleting a run asked to be resumed loses it).

    A launch (not a dry run) first takes the run's lease (``toolkit.lease``), before anything in the directory is
    changed, and keeps it: the local supervisor this process becomes renews it; a Slurm submission releases it for
    the job. Raises ConfigError naming the holder when another supervisor is alive on the run.
    """
    if resume and clean:
        raise ConfigError(RESUME_CLEAN_MSG)
    run = run or run_dir_for(loaded, resume=resume)
    if (run.root / "manifest.json").is_file() and not run.configs.is_dir():
        # A sweep's root: run files there would hide the sweep from srl status and srl cancel.
        raise ConfigError(
            f"{run.root} is a sweep's directory (it has manifest.json), not a run's; set a different "
            "run.name or output_dir"
        )
    if dry_run:
        return _prepare_run(loaded, run, argv=argv, resume=resume, clean=clean, dry_run=True)
    # Before anything in the directory is read for a decision or changed: another supervisor may be running it.
    created = not run.root.exists()
    held = _take_lease(run, argv)
    try:
        _refuse_if_run_jobs_live(run)
        _refuse_owned_deployment(loaded, run)
        _refuse_trained_teacher(loaded)
        out = _prepare_run(loaded, run, argv=argv, resume=resume, clean=clean, dry_run=False, held=held)
    except BaseException:
        held.release()
        if created:  # a refused new run leaves nothing behind
            shutil.rmtree(run.root, ignore_errors=True)
        raise
    return out


def _refuse_if_run_jobs_live(run: RunDir) -> None:
    """Raise ConfigError when a Slurm job submitted for ``run`` is still queued or running (a queued or requeued
    job holds no lease until it starts, and would then run the run a second time). Only for runs that were ever
    submitted (:func:`refuse_live_jobs`)."""
    if run.launcher.is_dir() and any(run.launcher.glob("*.sbatch")):
        refuse_live_jobs(run.root, "run", besides=run.gates)


def refuse_live_jobs(root: Path, what: str, *, besides: Path | None = None) -> None:
    """Raise ConfigError naming the queued or running Slurm jobs that log under ``root`` (a run or sweep directory,
    ``what`` says which) but not under ``besides`` (a run's first-run gate jobs): a second launch would run it
    twice. When Slurm cannot be asked, say so and go on (the lease still guards a job that starts)."""
    from . import slurm

    try:
        jobs = slurm.jobs_logging_under(root, besides=besides)
    except slurm.SlurmCommandError as exc:
        print(f"note: could not ask Slurm whether a job of the {what} {root} is queued ({exc})", file=sys.stderr)
        return
    if jobs:
        raise ConfigError(
            f"{what} {root} has Slurm job(s) {', '.join(jobs)} queued or running, which will run it; "
            f"stop them first: srl cancel {root}"
        )


def _refuse_owned_deployment(loaded: LoadedConfig, run: RunDir) -> None:
    """Raise ConfigError when the external inference deployment this run would load its weights into already
    serves another live run's weights, or a full-weight run would join a live LoRA run there (the orchestrator takes
    the deployment's lease itself when it starts, so this early look only saves a launch that would be refused)."""
    cfg = loaded.config
    if not cfg.inference.external or not cfg.orchestrator.update_weights:
        return
    lora = cfg.trainer.model.lora is not None
    why = leases.deployment_refusal(RunDir(Path(cfg.inference.external)), run, lora=lora)
    if why is not None:
        raise ConfigError(f"inference.external: {why}")


def _refuse_trained_teacher(loaded: LoadedConfig) -> None:
    """Raise ConfigError when a distilling env's teacher deployment (``algo.teacher.deployment``) has a live run
    loading its weights into it: a teacher must stay frozen (the orchestrator looks again when it starts)."""
    for field, _env, algo in loaded.config.orchestrator.distilling_envs():
        if algo.teacher is not None and algo.teacher.deployment is not None:
            why = leases.teacher_refusal(RunDir(Path(algo.teacher.deployment).expanduser()))
            if why is not None:
                raise ConfigError(f"{field}.teacher.deployment: {why}")


def _take_lease(run: RunDir, argv: list[str]) -> leases.Lease:
    """The run lease for this process (kept by the supervisor it becomes; released by a Slurm submission). Raises
    ConfigError naming the live holder and how to stop it."""
    try:
        return leases.acquire(run, command=shlex.join(argv[:2]))
    except leases.LeaseHeld as e:
        raise ConfigError(str(e)) from None


def _prepare_run(
    loaded: LoadedConfig,
    run: RunDir,
    *,
    argv: list[str],
    resume: bool,
    clean: bool,
    dry_run: bool,
    held: leases.Lease | None = None,
) -> tuple[RunDir, int]:
    exists = run.configs.exists() or run.configs.is_symlink()
    if exists and not resume and not clean and only_dry_runs(run):
        _refuse_if_jobs_queued(run)
        _delete_keeping_lease(run, held)  # only would-be configs, placement and scripts: nothing was launched
        exists = False
    if exists and not (resume or clean):
        raise ConfigError(
            f"run directory {run.root} already exists; pass --resume to continue it, --clean to delete it and "
            "start over, or set a different run.name"
        )
    if resume and not exists:
        raise ConfigError(f"--resume: no run at {run.root} (nothing to resume)")
    if clean and exists:
        _delete_keeping_lease(run, held)
    try:
        for d in (
            run.configs,
            run.launcher,
            run.logs,
            run.rollouts,
            run.broadcasts,
            run.checkpoints,
            run.store,
            run.control,
            run.reports,
        ):
            d.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # preflight checked output_dir; the filesystem can still change or fill up since
        raise ConfigError(f"output_dir: cannot create the run directory {run.root}: {e.strerror or e}") from e
    # A stale stop request from an earlier attempt would end the new one at once.
    run.stop_request.unlink(missing_ok=True)
    from ..run import ending

    ending.clear(run)  # the earlier attempt's ending; this one's is recorded when it ends
    attempt = run.next_attempt()
    adir = run.config_attempt(attempt)
    (adir / "inputs").mkdir(parents=True)
    (adir / "resolved").mkdir()
    for i, src in enumerate(loaded.inputs):
        shutil.copyfile(src, adir / "inputs" / f"{i:02d}-{Path(src).name}")
    atomic_write_text(adir / "command.txt", shlex.join(argv) + "\n")
    if dry_run:
        mark_not_launched(run, attempt, "srl --dry-run")
    cfg = loaded.config
    atomic_write_json(adir / "resolved" / "rl.json", cfg.model_dump(mode="json"))
    point_symlink(run.latest_configs, adir.name)
    if not run.run_meta.exists():
        atomic_write_json(run.run_meta, {"run_id": uuid.uuid4().hex, "created": time.time(), "name": cfg.run.name})
    return run, attempt


def _delete_keeping_lease(run: RunDir, held: leases.Lease | None) -> None:
    """Delete the run directory; this launch's lease (in it) is written again right after. Raises ConfigError when
    another launch took the lease meanwhile."""
    if held is None:
        _delete_run_dir(run.root)
        return
    try:
        with held.emptying():
            _delete_run_dir(run.root)
    except leases.LeaseHeld as e:
        raise ConfigError(str(e)) from None
