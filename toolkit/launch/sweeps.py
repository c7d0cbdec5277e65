"""Sweeps on Slurm: every point an ``srl rl`` batch job, run inside job array tasks that fit its allocation.

On the login node each point gets its own run directory, plan and batch script (``<point>/launcher/rl.sbatch``,
exactly what ``srl rl`` would submit for it). Points are grouped by allocation shape (the script's ``#SBATCH``
lines: nodes, GPUs per node, partition, time, account, requeue and signal, het groups); each shape becomes one or
more job arrays whose task ``i`` executes the batch script of its ``i``-th point, so the task runs the same plan
and the same supervisor as ``srl rl`` (lease, resolved hosts, components, pre-timeout checkpoint and requeue).
Slurm has no heterogeneous job arrays: a point whose plan uses a het group runs as its own plain job.

``max_parallel`` bounds the tasks running at once over the whole sweep: arrays are spread over at most
``max_parallel`` lanes; the lanes share the throttle out (each array's ``%N`` is its lane's share) and an array
starts after the previous array of its lane ended (``--dependency=afterany``). See :func:`plan_arrays`.

Files in the sweep root: ``manifest.json`` (written by ``toolkit.sweep``), ``array_<k>.sbatch`` (one per array or
plain job), ``arrays.jsonl`` (one line per submission: job id, points, throttle, dependency) and
``logs/<sweep>-sweep-<k>_<array id>_<task>.out`` (one line per task start, naming the point's own batch log).
"""

from __future__ import annotations

import json
import re
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import ConfigError
from ..config.site import SiteConfig
from ..fsutil import atomic_write_json, atomic_write_text
from ..placement.plan import write_plan
from ..preflight import Preflight
from ..render import _env, build_context, job_name, render_job, sbatch_value
from ..run.layout import RunDir
from . import slurm
from .prepare import prepare_attempt, refuse_live_jobs
from .submit import hand_over, read_job_ids, record_job_id

# Directives that name a job and its logs: a point's script has its own, the array script has the sweep's.
_PER_JOB = ("--job-name=", "--output=", "--error=")


@dataclass
class PreparedPoint:
    """A point ready to run: its run directory and attempt, its batch script, its allocation ``shape`` (the
    script's ``#SBATCH`` lines per het group, minus name and logs) and the log file name prefix (its job name)."""

    index: int
    point_id: str
    run: RunDir
    attempt: int
    script: Path
    shape: tuple[tuple[str, ...], ...]
    log_prefix: str


@dataclass
class ArrayChunk:
    """One submission: ``points`` (indices into the prepared list, task ``i`` runs ``points[i]``) of one shape;
    ``array`` False for a plain job (a het-group point); ``throttle`` its ``%N``; ``after`` the chunk (index)
    whose job must end first (``afterany``), None to start at once; ``lane`` the lane it runs in."""

    shape: int
    points: list[int]
    array: bool
    throttle: int
    lane: int
    after: int | None = None
    job_id: str | None = field(default=None, compare=False)


def plan_arrays(shapes: list[tuple[int, bool]], max_parallel: int, max_array_size: int) -> list[ArrayChunk]:
    """Split shapes into submissions that never run more than ``max_parallel`` tasks at once, together.

    ``shapes``: per shape, its number of points and whether it may be an array (False: het jobs, one plain job per
    point). Each shape is cut into chunks of at most ``max_array_size`` tasks. Chunks go to
    ``L = min(max_parallel, chunks)`` lanes, each to the lane with the fewest points so far; lane ``j``'s throttle
    is ``max_parallel // L`` plus one for the first ``max_parallel % L`` lanes (the throttles sum to
    ``max_parallel``; none is above its chunk's size), and a chunk waits for the previous chunk of its lane. Only
    one chunk per lane is ever running, so at most ``max_parallel`` tasks run. Raises ValueError for ``max_parallel`` or
    ``max_array_size`` < 1.
    """
    if max_parallel < 1 or max_array_size < 1:
        raise ValueError("max_parallel and max_array_size must be >= 1")
    chunks: list[ArrayChunk] = []
    first = 0
    for shape, (n, can_array) in enumerate(shapes):
        size = max_array_size if can_array else 1
        for start in range(0, n, size):
            pts = list(range(first + start, first + min(n, start + size)))
            chunks.append(ArrayChunk(shape, pts, can_array, 1, 0))
        first += n
    if not chunks:
        return []
    lanes = min(max_parallel, len(chunks))
    load = [0] * lanes
    last: list[int | None] = [None] * lanes
    for i, c in enumerate(chunks):
        lane = min(range(lanes), key=lambda j: (load[j], j))
        c.lane = lane
        # Never above the chunk's own size: Slurm refuses a %N it cannot hold (a 32-bit limit), and a larger
        # throttle than tasks runs nothing more.
        c.throttle = min(len(c.points), max_parallel // lanes + (1 if lane < max_parallel % lanes else 0))
        c.after = last[lane]
        last[lane] = i
        load[lane] += len(c.points)
    return chunks


def refuse_if_sweep_live(root: Path) -> None:
    """Raise ConfigError when an array task (or plain job) of the sweep at ``root`` is queued or running: a
    second submission would run its points twice. A note, not an error, when Slurm cannot be asked."""
    if (root / "manifest.json").exists():
        refuse_live_jobs(root, "sweep")


def finished(run: RunDir, max_steps: int) -> bool:
    """Whether the point's run has a complete checkpoint at ``max_steps`` (nothing left to train)."""
    from ..checkpoints import latest_complete

    step = latest_complete(run) if run.configs.exists() else None
    return step is not None and step >= max_steps


def update_run_meta(run: RunDir, fields: dict[str, Any]) -> None:
    """Add ``fields`` to the run's ``run_meta.json`` (a sweep point's id, values and array task)."""
    meta = json.loads(run.run_meta.read_text())
    atomic_write_json(run.run_meta, {**meta, **fields})


def point_meta(point: Any) -> dict[str, Any]:
    """What a point's ``run_meta.json`` records of its sweep point: id, axis values, seed, array index."""
    return {"sweep_point": point.params, "seed": point.seed, "point_id": point.point_id, "sweep_index": point.index}


def _shape(directives: list[list[str]]) -> tuple[tuple[str, ...], ...]:
    return tuple(tuple(d for d in group if not d.startswith(_PER_JOB)) for group in directives)


def prepare_points(
    sweep: Any,
    configs: list[Preflight],
    site: SiteConfig,
    root: Path,
    *,
    argv: list[str],
    dry_run: bool,
    resume: bool,
    clean: bool,
) -> list[PreparedPoint]:
    """Write each point's run directory, plan (the one its preflight built, ``configs``) and batch script, as
    ``srl rl`` (``--dry-run``) would.

    With ``resume``: a point whose run finished is left out, an existing one gets a resumed attempt, a missing one
    a first attempt. Every plan was built by the points' preflight, before any point is written. A point that cannot run
    on the site (more nodes or GPUs per node than it has) was already refused, naming the point, by the preflight of its
    config (``toolkit.sweep.point_config``). Raises ConfigError (an existing point without ``--resume``/``--clean``, a
    live holder of a point's lease) at the point concerned.
    """
    out: list[PreparedPoint] = []
    for point, checked in zip(sweep.points, configs):
        loaded, plan, live = checked.loaded, checked.plan, RunDir(root / point.point_id)
        cfg = loaded.config
        if resume and finished(live, cfg.max_steps):
            print(f"  {point.point_id}: finished (checkpoint at step {cfg.max_steps}); skipped")
            continue
        run, attempt = prepare_attempt(
            loaded, live, argv=argv, dry_run=dry_run, resume=resume and live.configs.exists(), clean=clean
        )
        update_run_meta(run, {"sweep": sweep.name, **point_meta(point), "sweep_root": str(root)})
        write_plan(run, plan)
        script = render_job(cfg, run, plan, attempt=attempt, site=site)
        ctx = build_context(cfg, site, run, plan, attempt=attempt)
        if not dry_run:
            hand_over(run, attempt)  # the array task takes the lease when it starts
        out.append(
            PreparedPoint(point.index, point.point_id, run, attempt, script, _shape(ctx.directives), job_name(cfg))
        )
    return out


def render_array(sweep_name: str, index: int, chunk: ArrayChunk, prepared: list[PreparedPoint], root: Path) -> str:
    """The batch script of one chunk: the chunk's shape, named ``<sweep>-sweep-<index>``, logs
    ``<root>/logs/%x_%A_%a.out`` (plain jobs ``%x-%j.out``), ``--array=0-<n-1>%<throttle>``. Raises RenderError
    for a value that cannot go into an ``#SBATCH`` line."""
    pts = [prepared[i] for i in chunk.points]
    name = sbatch_value(f"{sweep_name}-sweep-{index}", "sweep.name")
    log = sbatch_value(str(root / "logs" / ("%x_%A_%a.out" if chunk.array else "%x-%j.out")), "sweep root")
    groups = [list(g) for g in pts[0].shape]
    groups[0] = [f"--job-name={name}", f"--output={log}", f"--error={log}", *groups[0]]
    if chunk.array:
        groups[0].append(f"--array=0-{len(pts) - 1}%{chunk.throttle}")
    # What sweep.sbatch.j2 prints: directives per het group, the sweep root, points and log prefixes in task order.
    ctx = {
        "sweep": sweep_name,
        "index": index,
        "directives": groups,
        "root": str(root),
        "array": chunk.array,
        "points": [p.point_id for p in pts],
        "logs": [f"{p.log_prefix}-" for p in pts],
    }
    return _env().get_template("sweep.sbatch.j2").render(ctx=ctx)


def submit_arrays(
    sweep_name: str,
    prepared: list[PreparedPoint],
    site: SiteConfig,
    root: Path,
    *,
    max_parallel: int,
    dry_run: bool = False,
) -> list[str]:
    """Group ``prepared`` points by shape, plan the submissions (:func:`plan_arrays`), render
    ``<root>/array_<k>.sbatch`` for each and, unless ``dry_run``, submit them in order (each behind its lane's
    previous one). Records ``arrays.jsonl`` and, in each point's ``launcher/job_ids.txt``, its task as
    ``<array id>_<task>``. Returns the job ids (the script paths when ``dry_run``). Raises SubmitError."""
    by_shape: dict[tuple[tuple[str, ...], ...], list[int]] = {}
    for i, p in enumerate(prepared):
        by_shape.setdefault(p.shape, []).append(i)
    order = [i for idxs in by_shape.values() for i in idxs]
    ordered = [prepared[i] for i in order]
    shapes = [(len(idxs), len(shape) == 1) for shape, idxs in by_shape.items()]
    chunks = plan_arrays(shapes, max_parallel, site.limits.max_array_size)
    (root / "logs").mkdir(parents=True, exist_ok=True)
    for old in root.glob("array_*.sbatch"):
        old.unlink()
    out: list[str] = []
    for k, chunk in enumerate(chunks):
        script = root / f"array_{k}.sbatch"
        atomic_write_text(script, render_array(sweep_name, k, chunk, ordered, root))
        if dry_run:
            out.append(str(script))
            continue
        extra = [f"--dependency=afterany:{chunks[chunk.after].job_id}"] if chunk.after is not None else []
        chunk.job_id = slurm.submit(script, extra_args=extra, cwd=str(root))
        out.append(chunk.job_id)
        for task, i in enumerate(chunk.points):
            p = ordered[i]
            record_job_id(p.run, f"{chunk.job_id}_{task}" if chunk.array else chunk.job_id, "rl", p.attempt)
            update_run_meta(p.run, {"array_job_id": chunk.job_id, "array_task_id": task if chunk.array else None})
        rec = {
            "job_id": chunk.job_id,
            "script": script.name,
            "array": chunk.array,
            "throttle": chunk.throttle,
            "after": chunks[chunk.after].job_id if chunk.after is not None else None,
            "points": [ordered[i].point_id for i in chunk.points],
            "time": time.time(),
        }
        with open(root / "arrays.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")
        how = f"array 0-{len(chunk.points) - 1}%{chunk.throttle}" if chunk.array else "plain job (het groups)"
        after = f", after {rec['after']}" if rec["after"] else ""
        shape = " ".join(ordered[chunk.points[0]].shape[0])
        print(
            f"  {chunk.job_id}: {how}{after}: {' '.join(rec['points'])} ({shape})",
            file=sys.stderr,
        )
    return out


# ---- srl status / srl cancel of a sweep root --------------------------------------------------------------------


def read_manifest(root: Path) -> dict[str, Any]:
    """The sweep's ``manifest.json`` (name, points with their id, params, seed and run directory, the command).
    Raises ConfigError naming the file when it is cut off, not a manifest, or lacks a point's fields."""
    path = root / "manifest.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read the sweep manifest {path}: {e}") from None
    points = data.get("points") if isinstance(data, dict) else None
    if not (
        isinstance(data, dict)
        and isinstance(data.get("name"), str)
        and isinstance(points, list)
        and all(isinstance(p, dict) and {"point_id", "params", "seed", "run_dir"} <= p.keys() for p in points)
    ):
        raise ConfigError(
            f"{path} is not a sweep manifest (it needs name and points, each with point_id, params, "
            "seed and run_dir); `srl sweep ... --dry-run` writes it again"
        )
    return data


def is_sweep_root(path: Path) -> bool:
    """Whether ``path`` is a sweep's root (it holds ``manifest.json`` and is no run directory itself)."""
    return (path / "manifest.json").is_file() and not (path / "configs").is_dir()


def read_arrays(root: Path) -> list[dict[str, Any]]:
    """The submissions recorded in ``arrays.jsonl``, oldest first ([] when none). A line that is not a record
    with a ``job_id`` (cut off while written) is left out with a note on stderr: it names no job to act on."""
    try:
        lines = (root / "arrays.jsonl").read_text().splitlines()
    except OSError:
        return []
    out = []
    for n, ln in enumerate(lines, 1):
        if not ln.strip():
            continue
        try:
            rec = json.loads(ln)
        except ValueError:
            rec = None
        if isinstance(rec, dict) and "job_id" in rec:
            out.append(rec)
        else:
            print(f"note: {root / 'arrays.jsonl'} line {n} is not a submission record; left out", file=sys.stderr)
    return out


def _task_indices(spec: str) -> list[int]:
    """Task ids of a pending block as squeue/scontrol print it (``2-5%1``, ``1,3-4``); [] when unreadable."""
    out: list[int] = []
    for part in spec.split("%", 1)[0].split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?(?::(\d+))?", part.strip())
        if m:
            a, b, step = int(m.group(1)), int(m.group(2) or m.group(1)), int(m.group(3) or 1)
            out += list(range(a, b + 1, step))
    return out


def _job_states(root: Path) -> dict[str, Any]:
    """``"<array id>_<task>"`` (or a plain job id) -> JobState for every submission Slurm still knows."""
    states: dict[str, Any] = {}
    for rec in read_arrays(root):
        try:
            st = slurm.job_state(rec["job_id"])
        except slurm.SlurmCommandError:
            continue
        if not rec.get("array"):
            states[rec["job_id"]] = st
            continue
        for t in st.array_tasks or (st,):
            task = t.job_id.split("_", 1)[1] if "_" in t.job_id else ""
            ids = [int(task)] if task.isdigit() else _task_indices(task.strip("[]"))
            for i in ids:
                states[f"{rec['job_id']}_{i}"] = t
    return states


@dataclass
class PointStatus:
    """One row of ``srl status <sweep>``."""

    point_id: str
    params: dict[str, Any]
    state: str
    step: int | None
    reward: float | None
    task: str | None
    requeues: int


def sweep_status(root: Path) -> list[PointStatus]:
    """Every point of the sweep: Slurm state of its newest task (or, once Slurm forgot it, what its run directory
    says: finished / stopped / not started), last trainer step, last reward, array task, requeues."""
    from .progress import last_metrics, resolved_max_steps

    manifest = read_manifest(root)
    states = _job_states(root)
    rows = []
    for p in manifest["points"]:
        run = RunDir(root / p["point_id"])  # where points live (<root>/<point id>), also after the sweep moved
        jobs = read_job_ids(run) if run.launcher.is_dir() else []
        task = jobs[-1][0] if jobs else None
        st = states.get(task) if task else None
        last = last_metrics(run)
        step = last.get("trainer", {}).get("step")
        reward = last.get("orchestrator", {}).get("reward/all/mean")
        max_steps = resolved_max_steps(run)
        if st is not None:
            state = st.state
        elif max_steps is not None and finished(run, max_steps):
            state = "FINISHED"
        elif task is None:
            state = "NOT SUBMITTED"
        else:
            state = "ENDED" if step is not None else "UNKNOWN"
        requeues = st.restart_count if st is not None else 0
        rows.append(
            PointStatus(
                p["point_id"], p["params"], state, step, None if reward is None else float(reward), task, requeues
            )
        )
    return rows


def status_main(root: Path) -> int:
    """Print ``srl status`` of a sweep root: one line per point. Returns 0."""
    manifest = read_manifest(root)
    rows = sweep_status(root)
    print(f"sweep {manifest['name']} at {root}: {len(rows)} points")
    print("point\tstate\tstep\treward\tarray task\trequeues\tparams")
    for point, r in zip(manifest["points"], rows):  # rows are in the manifest's order
        reward = "-" if r.reward is None else f"{r.reward:.4f}"
        params = " ".join(f"{k}={v}" for k, v in r.params.items()) or "-"
        print(
            f"{r.point_id}\t{r.state}\t{'-' if r.step is None else r.step}\t{reward}\t{r.task or '-'}\t"
            f"{r.requeues}\t{params} seed={point['seed']}"
        )
    for rec in read_arrays(root):
        print(
            f"job {rec['job_id']}: "
            + ("array" if rec.get("array") else "plain job")
            + f" of {len(rec.get('points') or [])} point(s), throttle {rec.get('throttle')}"
            + (f", after {rec['after']}" if rec.get("after") else "")
        )
    return 0


def continue_command(root: Path) -> str:
    """The ``srl sweep ... --resume`` that continues the sweep at ``root`` (its recorded command line, minus
    ``--dry-run``/``--clean``/``--resume``)."""
    manifest = read_manifest(root)
    argv = [a for a in manifest.get("command", []) if a not in ("--dry-run", "--clean", "--resume")]
    return "srl sweep " + shlex.join(argv) + " --resume"


def cancel_main(root: Path, *, grace_s: float = 300.0) -> int:
    """``srl cancel <sweep root>``: cancel the sweep's pending tasks, ask its running points to checkpoint and
    stop (their STOP request), wait up to ``grace_s`` seconds for them to end, cancel what is left, and print how
    to continue the sweep. Returns 0 (1 when nothing of the sweep was ever submitted)."""
    arrays = read_arrays(root)
    if not arrays:
        print(f"{root}: no array job recorded (a dry run, or a local sweep)", file=sys.stderr)
        return 1
    live = slurm.live_jobs(rec["job_id"] for rec in arrays)
    if not live:
        print("no running or pending task")
    else:
        # Pending tasks first, so none starts while the running points checkpoint.
        for job in live:
            slurm._run(["scancel", "--state=PENDING", job], timeout_s=slurm.DEFAULT_TIMEOUT_S)
        try:
            running = [r for r in sweep_status(root) if r.state in ("RUNNING", "COMPLETING", "CONFIGURING")]
        except ConfigError as e:
            # Cancelling must still work: without the points, running ones cannot checkpoint first.
            print(f"{e.issues[0].message}: running points are cancelled without a checkpoint", file=sys.stderr)
            running = []
        for r in running:
            run = RunDir(root / r.point_id)
            run.control.mkdir(parents=True, exist_ok=True)
            run.stop_request.touch()
            print(f"{r.point_id} (task {r.task}, step {r.step}): asked to checkpoint and stop")
        deadline = time.monotonic() + grace_s
        while running and time.monotonic() < deadline:
            states = _job_states(root)
            if all(states.get(r.task) is None or states[r.task].is_terminal for r in running):
                break
            time.sleep(1.0)
        for job in live:
            slurm.cancel(job)
            print(f"cancelled {job}")
    try:
        again = continue_command(root)
    except ConfigError as e:
        print(
            f"{e.issues[0].message}; continue the sweep with its srl sweep command line and --resume", file=sys.stderr
        )
        return 0
    print(
        f"continue the sweep (finished points are skipped, the others resume from their newest checkpoint):\n  {again}"
    )
    return 0
