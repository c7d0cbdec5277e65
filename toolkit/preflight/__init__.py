"""Preflight: what a loaded run config points at outside itself, checked before anything is written or started,
and the placement plan built from it.

Modules:

- ``checks``: the model, env runtimes, the deployment's node arithmetic, files and run directories the config
  names; every env's taskset loaded as the job's env workers load it (job's interpreter and PYTHONPATH, no data):
  ids, config fields, ``select``, runtime, module.
- ``lora``: LoRA rules that need the model family and an external deployment's engines.
- ``site``: site files by name (``site-configs/``), checked against this machine; the run-vs-site rules.
- ``partitions``: a Slurm job's node groups against what Slurm says of their partitions (time, nodes, GPUs).

Typical use::

    loaded = load_config(files, overrides)   # toolkit.config: schema and cross-field rules
    checked = preflight(loaded, run=target)  # raises ConfigError listing every problem found here
    checked.site, checked.plan, checked.warnings   # the plan is the one the launch writes and submits
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from ..config import ConfigError, ConfigIssue, LoadedConfig, RLConfig, name_sources
from ..config.errors import Findings
from ..config.site import SiteConfig
from ..placement.plan import ROLES, PlacementError, Plan, launch_plan
from ..placement.topology import TopologyError
from ..run.layout import RunDir
from . import checks
from .partitions import check_partitions
from .site import check_owned_env, check_run_against_site, load_site, site_configs_dir

__all__ = ["Preflight", "load_site", "preflight", "site_configs_dir"]


@dataclass
class Preflight:
    """A config that passed preflight: the loaded config, its site, the warnings found here, and the plan."""

    loaded: LoadedConfig
    """The config as checked, with preflight's notes added (a copy: the one given to preflight is not changed);
    the one a launch writes."""
    site: SiteConfig
    findings: Findings
    """Warnings of the preflight checks (errors raise)."""
    plan: Plan | None
    """Every process of the run placed on the site (:func:`toolkit.placement.plan.launch_plan`): the plan a launch
    writes and submits, built only here. None when the deployment cannot be laid out on nodes, which
    :mod:`checks` reports."""

    @property
    def config(self) -> RLConfig:
        return self.loaded.config

    @property
    def warnings(self) -> list[ConfigIssue]:
        """Every warning: loading's, then preflight's."""
        return self.loaded.warnings + self.findings.warnings

    @property
    def notices(self) -> list[str]:
        return self.loaded.notices


def preflight(
    loaded: LoadedConfig, *, run: RunDir | None = None, roles: tuple[str, ...] = ROLES, probe: bool = False
) -> Preflight:
    """Check ``loaded`` against the world (model, tasksets, files, site, ports) and build its placement plan once.

    ``run``: the directory the launch will write (default ``output_dir/run.name``, or ``.../validate`` without a
    name); ``roles``: the roles to place (an SFT run: the trainer; a deployment: engines and router); ``probe``: a
    local launch moves its port block on until every port is free here (a dry run or a check does not).
    Raises ConfigError listing every problem, each naming the file that set the field when known.
    """
    cfg = loaded.config
    f = checks.check(cfg, purpose=loaded.purpose)
    run = run or RunDir(Path(cfg.output_dir) / (cfg.run.name or "validate"))
    site, plan = _site_and_plan(cfg, f, run, roles, probe)
    sources = [] if loaded.purpose == "serve" else checks.check_tasksets(cfg, site, f)
    if f.errors:
        raise ConfigError(name_sources(f.errors, loaded.origins))
    # Printed with the other notes and kept in the resolved config (configs/attempt_<n>/resolved/rl.json): a new
    # LoadedConfig and config, so the caller's stay as they were given.
    checked = replace(
        loaded, config=cfg.model_copy(update={"notices": [*cfg.notices, *sources]}), notices=[*loaded.notices, *sources]
    )
    return Preflight(checked, site, f, plan)


def _site_and_plan(
    cfg: RLConfig, f: Findings, run: RunDir, roles: tuple[str, ...], probe: bool
) -> tuple[SiteConfig | None, Plan | None]:
    """Load the site, apply the run-vs-site rules, and build the plan so that pass-through argument and port-range
    problems surface before anything is written."""
    sites = sorted(p.stem for p in site_configs_dir().glob("*.toml"))
    if sites and cfg.site not in sites:
        f.error("site", f"unknown site '{cfg.site}'; allowed: {', '.join(sites)} (files in {site_configs_dir()})")
        return None, None
    try:
        site = load_site(cfg.site)
    except ConfigError as e:
        for issue in e.issues:
            f.error(f"site ({cfg.site}): {issue.path}".rstrip(": "), issue.message)
        return None, None
    check_run_against_site(cfg, site, f)
    check_owned_env(cfg, f)
    if f.errors:
        return site, None
    try:
        plan = launch_plan(cfg, site, run, roles=roles, probe=probe)
    except TopologyError:
        return site, None  # reported by checks
    except PlacementError as e:
        f.error("inference / site ports", str(e))
        return site, None
    if site.is_slurm:
        check_partitions(cfg, plan, f)
    return site, plan
