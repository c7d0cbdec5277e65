"""Parameter sweeps: expand a sweep file into points, validate every point, run them as Slurm job arrays.

Sweep file (TOML)::

    [sweep]
    name = "lr-sweep"
    base = ["../reverse-text/rl.toml"]        # run configs, relative to this file, merged left to right
    seeds = [0, 1, 2]                         # a sweep axis; sets the top-level `seed`
    max_parallel = 2                          # most points running at once, over all arrays
    [sweep.grid]                              # cartesian product over dotted config paths
    "trainer.optim.lr" = [1e-4, 5e-4]
    [sweep.zip]                               # lists of equal length, varied together
    [sweep.random]                            # random points: samples = N, path = {uniform|log_uniform|choice}
    [config]                                  # plain config tables applied to every point

Every point is validated as a full run config (the base files, ``[config]``, then the command line's overlay files
and dotted overrides, then the point's own values) before anything is written or submitted. Each point runs in its
own run directory ``<output_dir>/<sweep>/<point id>``, keyed by point id, never by ``SLURM_JOB_ID`` (a requeued
task may get a new one). On a Slurm site every point runs as the ``srl rl`` batch job it would be on its own, inside a
job array task that requests its whole allocation (``toolkit.launch.sweeps``); locally the points run here,
``max_parallel`` at a time.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import re
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .config import ConfigError, ConfigIssue, LoadedConfig, name_sources, validate_dict
from .config.cli_args import split_config_args
from .config.compose import deep_merge, merge_layers, parse_overrides, read_toml, record_origins, subtable
from .config.convert import to_canonical
from .preflight import Preflight, preflight

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
    """A parsed sweep: its points, the layers every point shares (``base_files``, ``common`` = ``[config]``,
    command-line ``overlays`` and dotted ``overrides``) and ``max_parallel``, the most tasks running at once."""

    name: str
    base_files: list[Path]
    points: list[SweepPoint]
    max_parallel: int
    common: dict[str, Any]
    overlays: list[Path] = field(default_factory=list)
    overrides: list[str] = field(default_factory=list)


def load_sweep(path: Path) -> Sweep:
    """Parse and expand a sweep file. Raises ConfigError naming the field for any problem."""
    raw = read_toml(path)
    unknown = set(raw) - {"sweep", "config"}
    if unknown:
        raise ConfigError(
            [ConfigIssue(k, "unknown table; a sweep file has [sweep] and [config]", str(path)) for k in sorted(unknown)]
        )
    sw = raw.get("sweep")
    if not isinstance(sw, dict):
        raise ConfigError("missing [sweep] table", source=str(path))
    allowed = {"name", "base", "seeds", "max_parallel", "grid", "zip", "random"}
    bad = set(sw) - allowed
    if bad:
        raise ConfigError(
            [
                ConfigIssue(f"sweep.{k}", f"unknown key (allowed: {', '.join(sorted(allowed))})", str(path))
                for k in sorted(bad)
            ]
        )
    name = sw.get("name")
    # ASCII only, starting with a letter or digit, as run.name: str.isalnum() let '²' or '٣' into Slurm job names
    # and directory names, and a leading '-' reads as an option to the commands that take the sweep directory.
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}", name):
        raise ConfigError(
            f"sweep.name must be 1-128 ASCII letters, digits, '-' or '_', starting with a letter or "
            f"digit (got {name!r})",
            source=str(path),
        )
    base = sw.get("base", [])
    if not isinstance(base, list) or not base or not all(isinstance(b, str) and "\x00" not in b for b in base):
        raise ConfigError("sweep.base must be a non-empty list of config file paths (no NUL bytes)", source=str(path))
    base_files = [(path.parent / b).resolve() for b in base]
    seeds = sw.get("seeds", [0])
    if (
        not isinstance(seeds, list)
        or not seeds
        or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds)
    ):
        raise ConfigError("sweep.seeds must be a non-empty list of integers", source=str(path))
    if len(set(seeds)) != len(seeds):
        raise ConfigError(
            f"sweep.seeds lists a seed more than once ({seeds}): those points would run twice", source=str(path)
        )
    max_parallel = sw.get("max_parallel", 4)
    if not isinstance(max_parallel, int) or isinstance(max_parallel, bool) or max_parallel < 1:
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
    _refuse_repeated_points(grid, zipped, source)
    # Count before expanding: a typo'd grid (10 axes x 10 values) must be an error, not 10**10 dicts in memory.
    n_random = rnd.get("samples", 1) if isinstance(rnd, dict) and isinstance(rnd.get("samples"), int) else 1
    n_points = math.prod(len(v) for v in grid.values()) * (len(next(iter(zipped.values()))) if zipped else 1)
    if n_points * max(1, n_random) > MAX_POINTS:
        raise ConfigError(
            f"sweep expands to {n_points * max(1, n_random)} points (grid x zip x random.samples); "
            f"at most {MAX_POINTS} are allowed",
            source=source,
        )
    grid_pts = [dict(zip(grid, vals)) for vals in itertools.product(*grid.values())] if grid else [{}]
    zip_pts = [dict(zip(zipped, vals)) for vals in zip(*zipped.values())] if zipped else [{}]
    combos = [{**g, **z} for g in grid_pts for z in zip_pts]
    if rnd is not None:
        combos = [{**c, **r} for c in combos for r in _random_points(rnd, source)]
    return combos


def _refuse_repeated_points(grid: dict[str, list], zipped: dict[str, list], source: str) -> None:
    """Raise ConfigError for axes that would run a point twice or whose values would be silently replaced: a
    ``seed`` axis (each point's seed comes from sweep.seeds, set after the axes), a path in both grid and zip
    (zip's value won), a grid axis listing a value twice, or two equal rows of the zip lists."""
    for key, table in (("grid", grid), ("zip", zipped)):
        if "seed" in table:
            raise ConfigError(
                f"sweep.{key}.seed: seeds are varied by sweep.seeds = [...] (each point's seed is set "
                "from it, so a seed axis here would be replaced); list the seeds there",
                source=source,
            )
    both = sorted(set(grid) & set(zipped))
    if both:
        raise ConfigError(
            f"{', '.join(both)}: in both sweep.grid and sweep.zip (the zip value would win); "
            "keep each path in one of them",
            source=source,
        )
    for key, values in grid.items():
        seen = [json.dumps(v, sort_keys=True) for v in values]
        if len(set(seen)) != len(seen):
            raise ConfigError(
                f"sweep.grid.{key} lists a value more than once ({values}): its points would run "
                "twice; give each value once",
                source=source,
            )
    rows = [json.dumps(row, sort_keys=True) for row in zip(*zipped.values())]
    if len(set(rows)) != len(rows):
        raise ConfigError(
            f"sweep.zip has two equal rows over {', '.join(zipped)}: those points would run twice; "
            "give each combination once",
            source=source,
        )


def _random_points(rnd: Any, source: str) -> list[dict[str, Any]]:
    samples = rnd.get("samples") if isinstance(rnd, dict) else None
    if not isinstance(samples, int) or isinstance(samples, bool) or samples < 1:
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
                raise ConfigError(
                    f"sweep.random.{key}: give one of uniform=[a,b], log_uniform=[a,b], choice=[...]", source=source
                )
            ((kind, arg),) = spec.items()
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
            raise ConfigError(
                f"sweep.random.{key}: {kind} needs [low, high] with finite numbers low <= high", source=source
            )
        if kind == "log_uniform" and arg[0] <= 0:
            raise ConfigError(f"sweep.random.{key}: log_uniform needs 0 < low", source=source)
    elif kind == "choice" and not (isinstance(arg, list) and arg):
        raise ConfigError(f"sweep.random.{key}: choice needs a non-empty list of values", source=source)


def point_config(sweep: Sweep, point: SweepPoint, output_dir: Path | None = None) -> Preflight:
    """The full validated and preflighted run config of one point (run name = point id, under
    ``<output_dir>/<sweep name>``), with the plan its job uses (:func:`toolkit.preflight.preflight`).

    Layers, later wins: the sweep's ``base`` files, its ``[config]`` table, the overlay files and dotted overrides
    of the command line (every point gets them), the point's own axis values, its seed. ``output_dir`` (a path)
    replaces the merged ``output_dir``. Raises ConfigError naming the point, its values and the field.
    """
    loaded, origins = _point_loaded(sweep, point, output_dir)
    return _point_check(point, origins)(loaded)


def _named(point: SweepPoint, origins: dict[str, str], e: ConfigError) -> ConfigError:
    for issue in name_sources(e.issues, origins):
        issue.message = f"[{point.point_id} {point.params} seed={point.seed}] {issue.message}"
    return e


def _point_check(point: SweepPoint, origins: dict[str, str]) -> Callable[..., Preflight]:
    """Preflight for one point's config, its errors naming the point, its values and the file that set a field."""

    def check(loaded: LoadedConfig, **kw: Any) -> Preflight:
        try:
            return preflight(loaded, **kw)
        except ConfigError as e:
            raise _named(point, origins, e) from None

    return check


def _point_loaded(sweep: Sweep, point: SweepPoint, output_dir: Path | None) -> tuple[LoadedConfig, dict[str, str]]:
    """One point's merged config, validated (schema and cross-field rules), and the origin of each field."""
    merged, origins, _ = merge_layers(sweep.base_files, shape=to_canonical)
    merged = deep_merge(merged, sweep.common)
    record_origins(sweep.common, f"{sweep.name} [config]", origins)
    if sweep.overlays or sweep.overrides:
        top, top_origins, _ = merge_layers(sweep.overlays, sweep.overrides, shape=to_canonical)
        merged = deep_merge(merged, top)
        origins.update(top_origins)
    for key, value in point.params.items():
        *parents, leaf = key.split(".")
        subtable(merged, *parents)[leaf] = value
    merged["seed"] = point.seed
    base_out = output_dir or merged.get("output_dir", "outputs")
    if not isinstance(base_out, (str, Path)) or not str(base_out):
        raise ConfigError(f"output_dir must be a directory path, got {base_out!r}", source=f"sweep {sweep.name}")
    merged["output_dir"] = str(Path(base_out) / sweep.name)
    if not isinstance(merged.setdefault("run", {}), dict):
        raise ConfigError(f"run must be a table, got {merged['run']!r}", source=f"sweep {sweep.name}")
    merged["run"]["name"] = point.point_id
    try:
        loaded = validate_dict(merged, source=f"sweep point {point.point_id}")
    except ConfigError as e:
        raise _named(point, origins, e) from None
    loaded.inputs = [*sweep.base_files, *sweep.overlays]
    return loaded, origins


# Failing points whose problems are listed in full; a sweep with a bad axis value can fail on every point.
_POINTS_SHOWN = 5


def point_configs(sweep: Sweep, output_dir: Path | None = None) -> list[Preflight]:
    """:func:`point_config` of every point, in order. Raises one ConfigError with the problems of every failing
    point (of the first five, and how many more fail), so one edit fixes them all."""
    out, issues, failing = [], [], []
    for point in sweep.points:
        try:
            out.append(point_config(sweep, point, output_dir))
        except ConfigError as e:
            failing.append(point.point_id)
            if len(failing) <= _POINTS_SHOWN:
                issues += e.issues
    if failing:
        if len(failing) > _POINTS_SHOWN:
            issues.append(
                ConfigIssue(
                    "",
                    f"{len(failing) - _POINTS_SHOWN} more of the {len(sweep.points)} points "
                    f"fail ({', '.join(failing[_POINTS_SHOWN : _POINTS_SHOWN + 10])}"
                    f"{', ...' if len(failing) > _POINTS_SHOWN + 10 else ''})",
                    f"sweep {sweep.name}",
                )
            )
        raise ConfigError(issues)
    return out


def check_overrides(sweep: Sweep) -> None:
    """Refuse command-line overrides of what the sweep varies itself (an axis, or ``seed`` of ``sweep.seeds``)
    and overlay files that set an axis: the point's own value would silently win over them. An overlay's ``seed``
    is let through (whole run configs such as rl-lora.toml set one; the points' seeds replace it). Raises
    ConfigError naming the field and the file (or the command line) that set it."""
    flat: dict[str, str] = {}
    own = [(str(f), t["sweep"]) for f in sweep.overlays if isinstance((t := read_toml(f)).get("sweep"), dict)]
    own += [
        ("command line", t["sweep"]) for t in [parse_overrides(sweep.overrides)] if isinstance(t.get("sweep"), dict)
    ]
    if own:
        # Checked once, here: left in, every point's run config would report it as an unknown key.
        raise ConfigError(
            [
                ConfigIssue(
                    "sweep." + ", sweep.".join(sorted(tree)),
                    "the sweep's own settings are read from the sweep file (the first @ file) "
                    "only; change them there (overlays and --section.field overrides apply to every "
                    "point's run config)",
                    source,
                )
                for source, tree in own
            ]
        )

    def walk(tree: dict[str, Any], prefix: str, source: str) -> None:
        for k, v in tree.items():
            if isinstance(v, dict):
                walk(v, f"{prefix}{k}.", source)
            else:
                flat[f"{prefix}{k}"] = source

    for f in sweep.overlays:
        walk(to_canonical(read_toml(f), source=str(f))[0], "", str(f))
    flat.pop("seed", None)
    walk(parse_overrides(sweep.overrides), "", "command line")
    axes = {k.replace("-", "_") for p in sweep.points for k in p.params} | {"seed"}
    # An axis that is a whole table (``deployment = [{...}, ...]``) replaces it: every field under it clashes too.
    clash = sorted(k for k in flat if any(k == a or k.startswith(a + ".") for a in axes))
    if clash:
        raise ConfigError(
            [
                ConfigIssue(
                    k,
                    "is varied by the sweep itself (an axis of [sweep], or sweep.seeds); "
                    "change it in the sweep file, not in an overlay or on the command line",
                    flat[k],
                )
                for k in clash
            ]
        )


def write_manifest(sweep: Sweep, root: Path, command: list[str] | None = None) -> Path:
    """``manifest.json``: array index -> point id, params, seed, run directory; the layers every point shares
    (base files, ``[config]``, overlays, overrides) and the ``srl sweep`` command line that submitted it."""
    from .fsutil import atomic_write_json

    root.mkdir(parents=True, exist_ok=True)
    data = {
        "name": sweep.name,
        "base": [str(p) for p in sweep.base_files],
        "common": sweep.common,
        "overlays": [str(p) for p in sweep.overlays],
        "overrides": list(sweep.overrides),
        "command": list(command or []),
        "max_parallel": sweep.max_parallel,
        "points": [{**asdict(p), "run_dir": str(root / p.point_id)} for p in sweep.points],
    }
    path = root / "manifest.json"
    atomic_write_json(path, data)
    return path


HELP = """usage: srl sweep @ sweep.toml [@ overlay.toml ...] [--section.field VALUE ...] [--site S] [--output-dir D]
                 [--dry-run] [--resume] [--clean]

The first file is the sweep ([sweep] axes, seeds, max_parallel, base run configs; [config] for every point). Further
files are run-config overlays, merged onto every point after the base files and [config], and dotted overrides
apply to every point too (one that sets a swept field is refused). Each point is a full run under
<output_dir>/<sweep name>/<point id>, validated before anything is submitted.

On a Slurm site each point runs as an `srl rl` batch job would, inside a job array task that requests the point's
whole allocation (nodes, GPUs, partition, time, account); points of different shapes go into separate arrays that
together never run more than max_parallel tasks. Tasks requeue on preemption and at the pre-timeout signal and
resume their own point. On the local site the points run here, max_parallel at a time.

  --dry-run   write the manifest, every point's run directory and the array scripts; submit nothing
  --resume    continue a sweep: finished points are skipped, the others resume from their newest checkpoint
  --clean     delete the points' run directories and start over
Follow it with `srl status <sweep dir>`; stop it with `srl cancel <sweep dir>`.
"""


def main(argv: list[str]) -> int:
    """``srl sweep @ sweep.toml [@ overlay.toml ...] [--a.b VALUE ...] [--site S] [--output-dir D] [--dry-run]
    [--resume] [--clean]``: the same command line as ``srl rl`` (:func:`toolkit.config.cli_args.split_config_args`).
    Returns the exit status; raises ConfigError before anything is written for a bad sweep or point."""
    files, overrides, flags = split_config_args(argv)
    if flags["help"]:
        print(HELP)
        return 0
    if not files:
        raise ConfigError("give the sweep file: srl sweep @ jobs/reverse-text/sweep.toml [@ overlay.toml ...]")
    if flags["resume"] and flags["clean"]:
        raise ConfigError("--resume and --clean contradict (continue the sweep, or delete it and start over): give one")
    sweep = load_sweep(files[0])
    sweep.overlays = [f.resolve() for f in files[1:]]
    sweep.overrides = list(overrides)
    check_overrides(sweep)
    configs = point_configs(sweep)  # every point validated before anything is written or submitted
    # Absolute: the array tasks read the manifest and write the points' run directories from wherever Slurm
    # starts them, not from the directory the sweep was submitted from.
    root = Path(configs[0].config.output_dir).expanduser().resolve()
    if (root / "configs").is_dir():
        # A run of the same name lives there: its files would hide the sweep from srl status and srl cancel.
        raise ConfigError(
            f"{root} is a run directory (it has configs/), not a sweep's; give the sweep another "
            "sweep.name or --output-dir"
        )
    from .preflight.site import load_site

    site = load_site(configs[0].config.site)
    sites = {c.config.site for c in configs}
    if len(sites) > 1:
        raise ConfigError(f"the points of one sweep run on one site; they name {sorted(sites)} (is site a sweep axis?)")
    if site.is_slurm:
        from .launch.sweeps import prepare_points, refuse_if_sweep_live, submit_arrays

        if not flags["dry_run"]:
            refuse_if_sweep_live(root)
        manifest = write_manifest(sweep, root, command=argv)
        print(f"sweep {sweep.name}: {len(sweep.points)} points, manifest {manifest}")
        prepared = prepare_points(
            sweep,
            configs,
            site,
            root,
            argv=["srl", "sweep", *argv],
            dry_run=flags["dry_run"],
            resume=flags["resume"],
            clean=flags["clean"],
        )
        ids = submit_arrays(sweep.name, prepared, site, root, max_parallel=sweep.max_parallel, dry_run=flags["dry_run"])
        if not ids:
            print("every point of the sweep has finished; nothing to submit")
            return 0
        print(("rendered" if flags["dry_run"] else "submitted") + f" array job(s): {', '.join(map(str, ids))}")
        return 0
    manifest = write_manifest(sweep, root, command=argv)
    print(f"sweep {sweep.name}: {len(sweep.points)} points, manifest {manifest}")
    if flags["dry_run"]:
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
        failed += sum(j.result() != 0 for j in jobs)
    print(f"sweep finished: {n - failed}/{n} points succeeded")
    return 1 if failed else 0


def sweep_from_manifest(manifest: Path) -> Sweep:
    """The Sweep a manifest (``<sweep root>/manifest.json``) was written from (points, shared layers); raises
    ConfigError when it is unreadable (:func:`toolkit.launch.sweeps.read_manifest`)."""
    from .launch.sweeps import read_manifest

    data = read_manifest(Path(manifest).parent)
    points = [SweepPoint(p["index"], p["point_id"], p["params"], p["seed"]) for p in data["points"]]
    return Sweep(
        data["name"],
        [Path(b) for b in data["base"]],
        points,
        int(data.get("max_parallel", 1)),
        data["common"],
        [Path(o) for o in data.get("overlays", [])],
        list(data.get("overrides", [])),
    )


def run_point(manifest: Path, index: int) -> int:
    """Run point ``index`` of a local sweep here, as a local run in its own run directory (no Slurm site)."""
    sweep = sweep_from_manifest(manifest)
    point = sweep.points[index]
    root = Path(manifest).parent
    loaded, origins = _point_loaded(sweep, point, root.parent)
    from .launch.pipeline import Launch, start
    from .launch.sweeps import point_meta, update_run_meta
    from .run.layout import RunDir

    live = RunDir(root / point.point_id)
    req = Launch(
        loaded, live, argv=["srl", "sweep", "run-point", str(manifest), str(index)], resume=live.configs.exists()
    )
    return start(
        req,
        check=_point_check(point, origins),
        after_prepare=lambda run, _: update_run_meta(run, {"sweep": sweep.name, **point_meta(point)}),
    ).status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
