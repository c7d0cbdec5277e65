"""Parameter sweeps: expand a sweep file into points, validate every point, run them as Slurm job arrays.

Sweep file (TOML)::

    [sweep]
    name = "lr-sweep"
    base = ["../reverse-text/rl.toml"]        # run configs, relative to this file, merged left to right
    seeds = [0, 1, 2]                         # a sweep axis; sets the top-level `seed`
    max_parallel = 2                          # array throttle (%P)
    [sweep.grid]                              # cartesian product over dotted config paths
    "trainer.optim.lr" = [1e-4, 5e-4]
    [sweep.zip]                               # lists of equal length, varied together
    [sweep.random]                            # random points: samples = N, path = {uniform|log_uniform|choice}
    [config]                                  # plain config tables applied to every point

Every point is validated as a full run config before anything is submitted. Array task ``i`` runs point ``i`` of the
manifest (``<output_dir>/<sweep>/manifest.json``), in its own run directory keyed by point id, never by
``SLURM_JOB_ID`` (field case B11).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import random
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .config import ConfigError, ConfigIssue, LoadedConfig, validate_dict
from .config.compose import _set_path, deep_merge, read_toml
from .config.convert import to_canonical
from .preflight import preflight

# Upper bound on points per sweep; far above a Slurm MaxArraySize (1001 by default), so only typos hit it.
MAX_POINTS = 100_000


@dataclass
class SweepPoint:
    """One point: ``index`` (array task id), ``point_id`` (directory name), dotted ``params``, ``seed``."""

    index: int
    point_id: str
    params: dict[str, Any]
    seed: int


@dataclass
class Sweep:
    name: str
    base_files: list[Path]
    points: list[SweepPoint]
    max_parallel: int
    common: dict[str, Any]


def load_sweep(path: Path) -> Sweep:
    """Parse and expand a sweep file. Raises ConfigError naming the field for any problem."""
    raw = read_toml(path)
    unknown = set(raw) - {"sweep", "config"}
    if unknown:
        raise ConfigError([ConfigIssue(k, "unknown table; a sweep file has [sweep] and [config]", str(path))
                           for k in sorted(unknown)])
    sw = raw.get("sweep")
    if not isinstance(sw, dict):
        raise ConfigError("missing [sweep] table", source=str(path))
    allowed = {"name", "base", "seeds", "max_parallel", "grid", "zip", "random"}
    bad = set(sw) - allowed
    if bad:
        raise ConfigError([ConfigIssue(f"sweep.{k}", f"unknown key (allowed: {', '.join(sorted(allowed))})",
                                       str(path)) for k in sorted(bad)])
    name = sw.get("name")
    if not isinstance(name, str) or not name.replace("-", "").replace("_", "").isalnum():
        raise ConfigError("sweep.name must be letters, digits, '-' or '_'", source=str(path))
    base = sw.get("base", [])
    if not isinstance(base, list) or not base or not all(isinstance(b, str) and "\x00" not in b for b in base):
        raise ConfigError("sweep.base must be a non-empty list of config file paths (no NUL bytes)", source=str(path))
    base_files = [(path.parent / b).resolve() for b in base]
    seeds = sw.get("seeds", [0])
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) for s in seeds):
        raise ConfigError("sweep.seeds must be a non-empty list of integers", source=str(path))
    max_parallel = sw.get("max_parallel", 4)
    if not isinstance(max_parallel, int) or max_parallel < 1:
        raise ConfigError("sweep.max_parallel must be an integer >= 1", source=str(path))
    combos = _expand(sw, str(path))
    points = []
    for params in combos:
        for seed in seeds:
            i = len(points)
            points.append(SweepPoint(i, f"p{i:03d}", params, seed))
    common = raw.get("config", {})
    if not isinstance(common, dict):
        raise ConfigError("[config] must be a table", source=str(path))
    return Sweep(name, base_files, points, max_parallel, common)


def _expand(sw: dict[str, Any], source: str) -> list[dict[str, Any]]:
    grid = sw.get("grid", {})
    zipped = sw.get("zip", {})
    rnd = sw.get("random")
    for key, table in (("grid", grid), ("zip", zipped)):
        if not isinstance(table, dict) or not all(isinstance(v, list) and v for v in table.values()):
            raise ConfigError(f"sweep.{key} maps dotted config paths to non-empty lists", source=source)
    lengths = {len(v) for v in zipped.values()}
    if len(lengths) > 1:
        raise ConfigError(f"sweep.zip lists must have equal lengths (got {sorted(lengths)})", source=source)
    # Count before expanding: a typo'd grid (10 axes x 10 values) must be an error, not 10**10 dicts in memory.
    n_random = rnd.get("samples", 1) if isinstance(rnd, dict) and isinstance(rnd.get("samples"), int) else 1
    n_points = math.prod(len(v) for v in grid.values()) * (len(next(iter(zipped.values()))) if zipped else 1)
    if n_points * max(1, n_random) > MAX_POINTS:
        raise ConfigError(f"sweep expands to {n_points * max(1, n_random)} points (grid x zip x random.samples); "
                          f"at most {MAX_POINTS} are allowed", source=source)
    grid_pts = [dict(zip(grid, vals)) for vals in itertools.product(*grid.values())] if grid else [{}]
    zip_pts = [dict(zip(zipped, vals)) for vals in zip(*zipped.values())] if zipped else [{}]
    combos = [{**g, **z} for g in grid_pts for z in zip_pts]
    if rnd is not None:
        combos = [{**c, **r} for c in combos for r in _random_points(rnd, source)]
    return combos


def _random_points(rnd: Any, source: str) -> list[dict[str, Any]]:
    if not isinstance(rnd, dict) or not isinstance(rnd.get("samples"), int) or rnd["samples"] < 1:
        raise ConfigError("sweep.random needs samples = N (>= 1)", source=source)
    seed = rnd.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ConfigError("sweep.random.seed must be an integer", source=source)
    rng = random.Random(seed)
    specs = {k: v for k, v in rnd.items() if k not in ("samples", "seed")}
    out = []
    for _ in range(rnd["samples"]):
        point = {}
        for key, spec in specs.items():
            if not isinstance(spec, dict) or len(spec) != 1:
                raise ConfigError(f"sweep.random.{key}: give one of uniform=[a,b], log_uniform=[a,b], choice=[...]",
                                  source=source)
            (kind, arg), = spec.items()
            _check_distribution(key, kind, arg, source)
            if kind == "uniform":
                point[key] = rng.uniform(*arg)
            elif kind == "log_uniform":
                point[key] = math.exp(rng.uniform(math.log(arg[0]), math.log(arg[1])))
            elif kind == "choice":
                point[key] = rng.choice(arg)
            else:
                raise ConfigError(f"sweep.random.{key}: unknown distribution '{kind}'", source=source)
        out.append(point)
    return out


def _check_distribution(key: str, kind: str, arg: Any, source: str) -> None:
    """Raise ConfigError unless ``arg`` suits ``kind``: [a, b] numbers (log_uniform: 0 < a), or a non-empty list."""
    def num(x: Any) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

    if kind in ("uniform", "log_uniform"):
        if not (isinstance(arg, list) and len(arg) == 2 and all(num(x) for x in arg) and arg[0] <= arg[1]):
            raise ConfigError(f"sweep.random.{key}: {kind} needs [low, high] with finite numbers low <= high",
                              source=source)
        if kind == "log_uniform" and arg[0] <= 0:
            raise ConfigError(f"sweep.random.{key}: log_uniform needs 0 < low", source=source)
    elif kind == "choice" and not (isinstance(arg, list) and arg):
        raise ConfigError(f"sweep.random.{key}: choice needs a non-empty list of values", source=source)


def point_config(sweep: Sweep, point: SweepPoint, output_dir: Path | None = None) -> LoadedConfig:
    """The full validated run config of one point (run name = point id, under ``<output_dir>/<sweep name>``)."""
    merged: dict[str, Any] = {}
    for f in sweep.base_files:
        canon, _ = to_canonical(read_toml(f), source=str(f))
        merged = deep_merge(merged, canon)
    merged = deep_merge(merged, sweep.common)
    for key, value in point.params.items():
        _set_path(merged, key.split("."), value)
    merged["seed"] = point.seed
    base_out = output_dir or merged.get("output_dir", "outputs")
    if not isinstance(base_out, (str, Path)) or not str(base_out):
        raise ConfigError(f"output_dir must be a directory path, got {base_out!r}", source=f"sweep {sweep.name}")
    merged["output_dir"] = str(Path(base_out) / sweep.name)
    if not isinstance(merged.setdefault("run", {}), dict):
        raise ConfigError(f"run must be a table, got {merged['run']!r}", source=f"sweep {sweep.name}")
    merged["run"]["name"] = point.point_id
    try:
        loaded = preflight(validate_dict(merged, source=f"sweep point {point.point_id}")).loaded
    except ConfigError as e:
        for issue in e.issues:
            issue.message = f"[{point.point_id} {point.params} seed={point.seed}] {issue.message}"
        raise
    loaded.inputs = list(sweep.base_files)
    return loaded


def write_manifest(sweep: Sweep, root: Path) -> Path:
    """``manifest.json``: array index -> point id, params, seed, run directory."""
    from .fsutil import atomic_write_json

    root.mkdir(parents=True, exist_ok=True)
    data = {"name": sweep.name, "base": [str(p) for p in sweep.base_files], "common": sweep.common,
            "points": [{**asdict(p), "run_dir": str(root / p.point_id)} for p in sweep.points]}
    path = root / "manifest.json"
    atomic_write_json(path, data)
    return path


def main(argv: list[str]) -> int:
    """``srl sweep @ sweep.toml [--dry-run] [--output-dir D]`` and ``srl sweep run-point MANIFEST INDEX``."""
    if argv and argv[0] == "run-point":
        offset = int(argv[4]) if len(argv) > 4 and argv[3] == "--offset" else 0
        return run_point(Path(argv[1]), int(argv[2]) + offset)
    parser = argparse.ArgumentParser(prog="srl sweep")
    parser.add_argument("at", choices=["@"])
    parser.add_argument("file", type=Path)
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--output-dir", type=Path)
    parser.add_argument("--site", help="site-configs/ name (overrides the configs' site)")
    args = parser.parse_args(argv)
    sweep = load_sweep(args.file)
    if args.site:
        sweep.common = deep_merge(sweep.common, {"site": args.site})
    configs = [point_config(sweep, p, args.output_dir) for p in sweep.points]  # validate all before submitting
    # Absolute: the array tasks read the manifest and write the points' run directories from wherever Slurm
    # starts them, not from the directory the sweep was submitted from.
    root = Path(configs[0].config.output_dir).resolve()
    manifest = write_manifest(sweep, root)
    print(f"sweep {sweep.name}: {len(sweep.points)} points, manifest {manifest}")
    site_name = configs[0].config.site
    from .preflight.site import load_site

    site = load_site(site_name)
    if site.is_slurm:
        from .launch.submit import submit_sweep

        ids = submit_sweep(sweep, manifest, configs[0].config, site, dry_run=args.dry_run)
        print(("rendered" if args.dry_run else "submitted") + f" array job(s): {', '.join(map(str, ids))}")
        return 0
    if args.dry_run:
        return 0
    return _run_local(manifest, len(sweep.points), sweep.max_parallel)


def _run_local(manifest: Path, n: int, parallel: int) -> int:
    """No Slurm: run the points through submitit's LocalExecutor, ``parallel`` at a time."""
    import submitit

    ex = submitit.LocalExecutor(folder=manifest.parent / "submitit" / "%j")
    ex.update_parameters(timeout_min=24 * 60)
    failed = 0
    for start in range(0, n, parallel):
        jobs = [ex.submit(run_point, manifest, i) for i in range(start, min(n, start + parallel))]
        for j in jobs:
            rc = j.result()
            failed += rc != 0
    print(f"sweep finished: {n - failed}/{n} points succeeded")
    return 1 if failed else 0


def run_point(manifest: Path, index: int) -> int:
    """Run one point of a sweep (what array task ``index`` executes)."""
    data = json.loads(Path(manifest).read_text())
    p = data["points"][index]
    sweep = Sweep(data["name"], [Path(b) for b in data["base"]], [], 1, data["common"])
    point = SweepPoint(p["index"], p["point_id"], p["params"], p["seed"])
    loaded = point_config(sweep, point, Path(p["run_dir"]).parent.parent)
    cfg = loaded.config
    # Inside an array task the point runs as a local run on the task's node.
    cfg.site = "local"
    from .launch.dispatch import launch
    from .launch.prepare import prepare_run
    from .rundir import RunDir

    resume = RunDir(Path(p["run_dir"])).configs.exists()
    run, attempt = prepare_run(loaded, argv=["srl", "sweep", "run-point", str(manifest), str(index)], resume=resume)
    meta = json.loads(run.run_meta.read_text())
    meta.update({"sweep": data["name"], "sweep_point": point.params, "seed": point.seed, "point_id": point.point_id,
                 "sweep_index": point.index})
    # Which array task ran this point, so offline tools can join the task's log (%x_%A_%a) to its point (B11).
    # Absent outside Slurm (local sweeps run points through submitit).
    if os.environ.get("SLURM_ARRAY_JOB_ID"):
        meta.update({"array_job_id": os.environ["SLURM_ARRAY_JOB_ID"],
                     "array_task_id": int(os.environ.get("SLURM_ARRAY_TASK_ID", "-1")),
                     "slurm_job_id": os.environ.get("SLURM_JOB_ID")})
    from .fsutil import atomic_write_json

    atomic_write_json(run.run_meta, meta)
    return launch(cfg, run, attempt=attempt, dry_run=False, resume=resume)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
