"""Site files and the rules that need both the run config and its site.

A site is found by name in ``site-configs/`` (or ``$SRL_SITE_CONFIGS``). Beyond its schema
(:mod:`toolkit.config.site`) it is checked against this machine: a port range that overlaps the kernel's ephemeral
range (``/proc/sys/net/ipv4/ip_local_port_range``) is an error, because an outgoing connection may already hold a
port srl hands to a server. A run is then checked against its site (accounting, GPUs per node, node limits,
``#SBATCH`` values, caches on shared filesystems, srl-owned environment names).
"""

from __future__ import annotations

import re
from pathlib import Path

from ..config.errors import ConfigError, Findings
from ..config.model import RLConfig
from ..config.rules import env_tables
from ..config.site import SBATCH_UNSAFE, SiteConfig, read_site, site_configs_dir
from ..placement.environment import CACHE_VARS, is_owned
from ..placement.topology import TopologyError, derive_topology

# Linux's default when /proc cannot be read (net.ipv4.ip_local_port_range).
DEFAULT_EPHEMERAL = (32768, 60999)
_SAFE_WORD = re.compile(r"[A-Za-z0-9_.,:@%+=/-]+")


def ephemeral_port_range(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> tuple[int, int]:
    """The kernel's ephemeral port range ``(low, high)`` inclusive; Linux's default if the file is unreadable."""
    try:
        lo, hi = (int(x) for x in path.read_text().split())
        return lo, hi
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL


def site_findings(site: SiteConfig, ephemeral: tuple[int, int] | None = None) -> Findings:
    """Checks of a site on its own: port range outside the ephemeral range and free of framework defaults."""
    f = Findings()
    lo, hi = ephemeral or ephemeral_port_range()
    a, b = site.ports.range_start, site.ports.range_end - 1
    if a <= hi and b >= lo:
        f.error(
            "ports",
            f"port range [{site.ports.range_start}, {site.ports.range_end}) overlaps the kernel's ephemeral range "
            f"[{lo}, {hi}] (ip_local_port_range): an outgoing connection may already hold a port; choose a range "
            f"below {lo} or above {hi}",
        )
    if site.accounting.required and not site.accounting.enabled:
        f.error("accounting.required", "an account can only be required on a site with accounting enabled")
    if site.scheduler == "local" and site.environment.container is not None:
        f.error("environment.container", "containers are only supported on Slurm sites")
    for m in site.environment.modules:
        if not _SAFE_WORD.fullmatch(m):
            f.error("environment.modules", f"'{m}' is not a module name")
    return f


def load_site(name_or_path: str | Path) -> SiteConfig:
    """Read and validate a site config by name (``site-configs/<name>.toml``) or path.

    Raises ConfigError naming the file and field for unknown keys, bad values, a port range overlapping the
    ephemeral range, or a missing file (listing the known sites).
    """
    base = site_configs_dir()
    p = Path(name_or_path)
    path = p if p.suffix == ".toml" else base / f"{p}.toml"
    if not path.is_file():
        known = ", ".join(sorted(x.stem for x in base.glob("*.toml")))
        raise ConfigError(f"site config {path} not found; known sites: {known}")
    site = read_site(path)
    found = site_findings(site)
    if found.errors:
        raise ConfigError(found.errors)
    return site


def check_run_against_site(cfg: RLConfig, site: SiteConfig, f: Findings) -> None:
    """Rules that need both the run config and its site; appends to ``f``.

    - accounting: ``--account`` only where the site has accounting, and required where it requires one;
    - GPUs per node must not exceed the site's nodes;
    - a single-node deployment on ``local`` needs no GPUs; multi-node needs a Slurm site;
    - a hetjob orchestrator needs a CPU partition (``deployment.orchestrator_partition`` or the site's);
    - JIT caches set by the user on the shared filesystem get a warning.
    """
    s = cfg.slurm
    if site.is_slurm:
        if s.account and not site.accounting.enabled:
            f.error(
                "slurm.account",
                f"site '{site.name}' has no accounting plugin: sbatch must not carry --account; remove slurm.account",
            )
        if site.accounting.required and not (s.account or site.accounting.default_account):
            f.error("slurm.account", f"site '{site.name}' requires an account: set slurm.account")
    gpn = cfg.deployment.gpus_per_node
    if site.is_slurm and site.gpu.gpus_per_node and gpn > site.gpu.gpus_per_node:
        f.error(
            "deployment.gpus_per_node",
            f"{gpn} GPUs per node requested but nodes of site '{site.name}' have {site.gpu.gpus_per_node}",
        )
    if not site.is_slurm and cfg.deployment.type == "multi_node":
        f.error("site", f"site '{site.name}' runs processes on this machine; a multi_node deployment needs Slurm")
    if site.is_slurm:
        _sbatch_values(cfg, site, f)
        _node_limit(cfg, site, f)
    _cache_dirs_on_shared_fs(cfg, site, f)


def _node_limit(cfg: RLConfig, site: SiteConfig, f: Findings) -> None:
    """The job's nodes (all heterogeneous components) must fit the site's ``limits.max_nodes``; checked before the
    plan is built, so a count with extra zeros is refused at once instead of placing millions of processes."""
    limit = site.limits.max_nodes
    if limit is None:
        return
    try:
        topo = derive_topology(cfg)
    except TopologyError:
        return  # reported by toolkit.preflight.checks
    # A multi-node run serves each of its own teachers on a node of its own (toolkit.placement.plan).
    teachers = len(cfg.orchestrator.served_teachers()) if cfg.deployment.type != "single_node" else 0
    total = topo.num_nodes + (1 if topo.orchestrator_het_group else 0) + teachers
    if total > limit:
        extra = f" + {teachers} served teacher node(s)" if teachers else ""
        f.error(
            "deployment",
            f"the layout needs {total} nodes ({topo.describe()}{extra}) but site '{site.name}' allows "
            f"at most {limit} (limits.max_nodes)",
        )


def sbatch_fields(cfg: RLConfig, site: SiteConfig) -> dict[str, str]:
    """Every config value a Slurm batch script prints inside an ``#SBATCH`` line, by the field that sets it.

    The log directory is ``output_dir`` made absolute (the run name is already restricted to safe characters).
    """
    s = cfg.slurm
    out = {
        f"slurm.{k}": getattr(s, k)
        for k in ("job_name", "partition", "account", "qos", "constraint", "nodelist", "exclude", "time")
    }
    out.update({f"slurm.extra_directives[{i}]": d for i, d in enumerate(s.extra_directives)})
    out["output_dir"] = str(Path(cfg.output_dir).expanduser().absolute())
    if cfg.deployment.type == "multi_node":
        out["deployment.orchestrator_partition"] = cfg.deployment.orchestrator_partition
    out[f"site ({site.name}): partitions.default"] = site.partitions.default
    out[f"site ({site.name}): partitions.cpu"] = site.partitions.cpu
    out[f"site ({site.name}): accounting.default_account"] = site.accounting.default_account
    return {k: v for k, v in out.items() if v is not None}


def _sbatch_values(cfg: RLConfig, site: SiteConfig, f: Findings) -> None:
    # Checked here, before the run directory is written, rather than only while rendering (toolkit.render raises
    # the same refusal as a RenderError, too late for a clean config error).
    fields = sbatch_fields(cfg, site)
    for path, value in fields.items():
        if SBATCH_UNSAFE.search(value):  # an empty value is left out of the script
            f.error(
                path,
                f"{value!r} cannot go into an #SBATCH line: no whitespace, newlines, quotes, backquotes or "
                "backslashes (sbatch would split or re-read the option)",
            )
    log_dir = fields.get("output_dir", "")
    if "%" in log_dir:
        # sbatch expands filename patterns (%j, %x, %u, %%...) anywhere in --output/--error, not only in the file
        # name: the job's logs would land in another directory than the run's.
        f.error(
            "output_dir",
            f"{log_dir!r} contains '%', which Slurm expands in the job's log paths (--output); "
            "choose an output directory without '%'",
        )


def _cache_dirs_on_shared_fs(cfg: RLConfig, site: SiteConfig, f: Findings) -> None:
    shared = site.filesystem.shared_root
    for path, table in env_tables(cfg).items():
        for key in CACHE_VARS:
            val = table.get(key)
            if val is None:
                continue
            # Loading made "~/..." absolute (toolkit.config.envpaths): this home's path stands for it.
            home = str(Path.home()).rstrip("/") + "/"
            on_home = site.filesystem.home_is_shared and val.startswith(("~", "$HOME", "${HOME}", "/home/", home))
            on_shared = bool(shared) and (val == shared or val.startswith(shared.rstrip("/") + "/"))
            if on_home or on_shared:
                f.warn(
                    f"{path}.{key}",
                    f"{val} is on a shared filesystem: concurrent JIT cache writes from several ranks race there "
                    "(stale file handles); leave it unset so srl uses node-local scratch per job",
                )


def check_owned_env(cfg: RLConfig, f: Findings) -> None:
    """Names srl sets from the plan (GPU binding, ports, rendezvous, run ids) may not appear in user env tables."""
    for path, table in env_tables(cfg).items():
        for key in table:
            if is_owned(key):
                f.error(
                    f"{path}.{key}",
                    f"{key} is set by srl from the placement plan (GPU binding, ports, rendezvous, run ids) and "
                    "cannot be overridden; remove it",
                )
