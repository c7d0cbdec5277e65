"""Site configs: what differs between clusters (GPU request style, accounting, ports, filesystems, modules).

A site is a TOML file in ``site-configs/`` named by ``RLConfig.site``. ``local`` means no Slurm: every process runs on
this machine. Validation is as strict as the run config (unknown keys are errors) and adds checks that need the
machine itself: a port range that overlaps the kernel's ephemeral range (``/proc/sys/net/ipv4/ip_local_port_range``)
is an error, because an outgoing connection may already hold a port srl hands to a server.

Light: pydantic and the standard library only (login-node safe).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from .errors import ConfigError, Findings, pydantic_issues
from .model import RLConfig, Section

# Framework defaults that srl never hands out: torchrun's master port and vLLM's HTTP port (field case B05).
FORBIDDEN_PORTS = frozenset({29500, 8000})
# Linux's default when /proc cannot be read (net.ipv4.ip_local_port_range).
DEFAULT_EPHEMERAL = (32768, 60999)
# An absolute path of safe characters, optionally starting with one $VAR / ${VAR} expanded on the compute node.
_SCRATCH_RE = re.compile(r"(\$\{?[A-Za-z_][A-Za-z0-9_]*\}?|/)[A-Za-z0-9_./-]*")
_SAFE_WORD = re.compile(r"[A-Za-z0-9_.,:@%+=/-]+")
# sbatch splits an #SBATCH line on whitespace and understands quotes and backslashes: a value holding any of them
# (or a newline, which would start a new script line) changes the options. Shared with toolkit.render.
SBATCH_UNSAFE = re.compile(r"[\s'\"\\`]")
GPU_REQUEST_STYLES = ("gres", "gpus-per-node", "gpus")


class GpuSection(Section):
    request_style: Literal["gres", "gpus-per-node", "gpus"] = "gres"
    """How batch scripts request GPUs: ``--gres=gpu[:type]:N``, ``--gpus-per-node=N`` or ``--gpus=N`` (total)."""
    gres_type: str | None = None
    """Typed GRES (``h100`` gives ``--gres=gpu:h100:8``); None = untyped."""
    gpus_per_node: int = Field(0, ge=0, le=64)
    """GPUs on one node of the default partition (0 = CPU nodes); used to check deployments."""

    @field_validator("gres_type")
    @classmethod
    def _word(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[A-Za-z0-9_.-]+", v):
            raise ValueError("gres_type must be letters, digits, '.', '_' or '-'")
        return v


class AccountingSection(Section):
    enabled: bool = False
    """The cluster has an accounting plugin (slurmdbd). Without it ``--account`` is never rendered."""
    required: bool = False
    """Jobs must name an account (``slurm.account`` or ``default_account``)."""
    default_account: str | None = None


class PortsSection(Section):
    range_start: int = Field(20000, ge=1024, le=65535)
    """First port srl may hand out (inclusive)."""
    range_end: int = Field(30000, ge=1024, le=65535)
    """Last port srl may hand out (exclusive)."""
    nodes_share_network: bool = False
    """All nodes share one network namespace (the local test cluster: every slurmd on 127.0.0.1), so ports must
    differ across nodes too, not only per host."""

    @model_validator(mode="after")
    def _order(self) -> PortsSection:
        if self.range_end - self.range_start < 64:
            raise ValueError(f"port range [{self.range_start}, {self.range_end}) must hold at least 64 ports")
        return self


class FilesystemSection(Section):
    shared_root: str | None = None
    """Shared storage root for runs (checkpoints, weights, rollouts, logs)."""
    home_is_shared: bool = True
    """``$HOME`` is on a shared filesystem (NFS): never put JIT caches there (field case B09)."""
    node_local_scratch: str = "/tmp"
    """Node-local scratch for per-job JIT/compile caches: an absolute path or ``$VAR[/sub]`` expanded on the node."""

    @field_validator("node_local_scratch")
    @classmethod
    def _scratch(cls, v: str) -> str:
        if not _SCRATCH_RE.fullmatch(v):
            raise ValueError("node_local_scratch must be an absolute path or $VAR[/path] of safe characters")
        return v


class PartitionsSection(Section):
    default: str | None = None
    """Partition for GPU components (None = the cluster's default partition)."""
    cpu: str | None = None
    """CPU partition for a heterogeneous orchestrator component."""


class ContainerSection(Section):
    type: Literal["apptainer"] = "apptainer"
    image: str
    """Image path on the shared filesystem (``.sif``)."""
    binds: list[str] = Field(default_factory=list)
    """Extra ``--bind`` specs (the run directory is always bound)."""


class EnvironmentSection(Section):
    modules: list[str] = Field(default_factory=list)
    """``module load`` names run at the top of every batch script."""
    setup: list[str] = Field(default_factory=list)
    """Trusted shell lines from the site admin (e.g. ``source /opt/env.sh``), run after modules."""
    python: str = "python3"
    """Python interpreter (with srl installed) on the compute nodes."""
    container: ContainerSection | None = None


class LimitsSection(Section):
    max_array_size: int = Field(1001, ge=1)
    """Slurm MaxArraySize: larger sweeps are split into several arrays."""
    max_nodes: int | None = Field(None, ge=1)


class SiteConfig(Section):
    """One cluster (or ``local``). Loaded by :func:`load_site`."""

    name: str
    scheduler: Literal["local", "slurm"] = "slurm"
    description: str = ""
    submit_host: Literal["login", "controller"] = "login"
    """Where ``sbatch`` runs (some clusters submit from the controller node)."""
    gpu: GpuSection = GpuSection()
    accounting: AccountingSection = AccountingSection()
    partitions: PartitionsSection = PartitionsSection()
    ports: PortsSection = PortsSection()
    filesystem: FilesystemSection = FilesystemSection()
    environment: EnvironmentSection = EnvironmentSection()
    limits: LimitsSection = LimitsSection()
    source: Path | None = None
    """File the site was read from (filled by :func:`load_site`)."""

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", v):
            raise ValueError("site name must be letters, digits, '.', '_' or '-'")
        return v

    @property
    def is_slurm(self) -> bool:
        return self.scheduler == "slurm"


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


def load_site(name_or_path: str | Path, *, directory: Path | None = None) -> SiteConfig:
    """Read and validate a site config by name (``site-configs/<name>.toml``) or path.

    Raises ConfigError naming the file and field for unknown keys, bad values, a port range overlapping the
    ephemeral range, or a missing file (listing the known sites).
    """
    from . import site_configs_dir

    base = directory or site_configs_dir()
    p = Path(name_or_path)
    path = p if p.suffix == ".toml" else base / f"{p}.toml"
    if not path.is_file():
        known = ", ".join(sorted(x.stem for x in base.glob("*.toml")))
        raise ConfigError(f"site config {path} not found; known sites: {known}")
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    except (OSError, UnicodeDecodeError) as e:  # a directory named *.toml, unreadable, or not UTF-8 text
        raise ConfigError(f"cannot read site config {path}: {e}") from None
    raw.setdefault("name", path.stem)
    try:
        site = SiteConfig.model_validate({**raw, "source": str(path)})
    except ValidationError as e:
        raise ConfigError(pydantic_issues(e, SiteConfig, source=str(path))) from None
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
    - JIT caches set by the user on the shared filesystem get a warning (field case B09).
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
    if cfg.inference.external and cfg.deployment.type == "single_node" and not site.is_slurm:
        pass  # a local run may use an inference deployment served elsewhere
    if site.is_slurm:
        _sbatch_values(cfg, site, f)
        _node_limit(cfg, site, f)
    _cache_dirs_on_shared_fs(cfg, site, f)


def _node_limit(cfg: RLConfig, site: SiteConfig, f: Findings) -> None:
    """The job's nodes (all heterogeneous components) must fit the site's ``limits.max_nodes``; checked before the
    plan is built, so a count with extra zeros is refused at once instead of placing millions of processes."""
    from ..placement.topology import TopologyError, derive_topology

    limit = site.limits.max_nodes
    if limit is None:
        return
    try:
        topo = derive_topology(cfg)
    except TopologyError:
        return  # reported by rules._deployment
    total = topo.num_nodes + (1 if topo.orchestrator_het_group else 0)
    if total > limit:
        f.error("deployment", f"the layout needs {total} nodes ({topo.describe()}) but site '{site.name}' allows "
                f"at most {limit} (limits.max_nodes)")  # fmt: skip


def sbatch_fields(cfg: RLConfig, site: SiteConfig) -> dict[str, str]:
    """Every config value a Slurm batch script prints inside an ``#SBATCH`` line, by the field that sets it.

    The log directory is ``output_dir`` made absolute (the run name is already restricted to safe characters).
    """
    s = cfg.slurm
    out = {f"slurm.{k}": getattr(s, k) for k in ("job_name", "partition", "account", "qos", "constraint",
                                                "nodelist", "exclude", "time")}  # fmt: skip
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
    for path, value in sbatch_fields(cfg, site).items():
        if SBATCH_UNSAFE.search(value):  # an empty value is left out of the script
            f.error(path, f"{value!r} cannot go into an #SBATCH line: no whitespace, newlines, quotes, backquotes or "
                    "backslashes (sbatch would split or re-read the option)")  # fmt: skip
    log_dir = sbatch_fields(cfg, site).get("output_dir", "")
    if "%" in log_dir:
        # sbatch expands filename patterns (%j, %x, %u, %%...) anywhere in --output/--error, not only in the file
        # name: the job's logs would land in another directory than the run's.
        f.error("output_dir", f"{log_dir!r} contains '%', which Slurm expands in the job's log paths (--output); "
                "choose an output directory without '%'")  # fmt: skip


_CACHE_VARS = ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "VLLM_CACHE_ROOT", "FLASHINFER_WORKSPACE_BASE")


def _cache_dirs_on_shared_fs(cfg: RLConfig, site: SiteConfig, f: Findings) -> None:
    from .rules import env_tables

    layers = env_tables(cfg)
    shared = [r for r in (site.filesystem.shared_root,) if r]
    for path, table in layers.items():
        for key in _CACHE_VARS:
            val = table.get(key)
            if val is None:
                continue
            on_home = site.filesystem.home_is_shared and (val.startswith(("~", "$HOME", "${HOME}", "/home/")))
            on_shared = any(val.startswith(r.rstrip("/") + "/") or val == r for r in shared)
            if on_home or on_shared:
                f.warn(
                    f"{path}.{key}",
                    f"{val} is on a shared filesystem: concurrent JIT cache writes from several ranks race there "
                    "(stale file handles); leave it unset so srl uses node-local scratch per job",
                )


def _owned_env_in_user_layers(cfg: RLConfig, f: Findings) -> None:
    from ..placement.environment import is_owned
    from .rules import env_tables

    layers = env_tables(cfg)
    for path, table in layers.items():
        for key in table:
            if is_owned(key):
                f.error(
                    f"{path}.{key}",
                    f"{key} is set by srl from the placement plan (GPU binding, ports, rendezvous, run ids) and "
                    "cannot be overridden; remove it",
                )


def site_rules(cfg: RLConfig, f: Findings) -> None:
    """Everything validation checks about ``cfg`` on its site: loads the site, applies
    :func:`check_run_against_site`, rejects srl-owned env names in user layers, and builds the placement plan once
    (job id "validate") so pass-through argument and port-range problems surface before anything is written."""
    try:
        site = load_site(cfg.site)
    except ConfigError as e:
        for issue in e.issues:
            f.error(f"site ({cfg.site}): {issue.path}".rstrip(": "), issue.message)
        return
    check_run_against_site(cfg, site, f)
    _owned_env_in_user_layers(cfg, f)
    if f.errors:
        return
    from ..placement.plan import PlacementError, build_plan
    from ..placement.topology import TopologyError
    from ..rundir import RunDir

    try:
        build_plan(cfg, site, RunDir(Path(cfg.output_dir) / (cfg.run.name or "validate")), job_id="validate")
    except TopologyError:
        pass  # already reported by rules._deployment
    except PlacementError as e:
        f.error("inference / site ports", str(e))


def job_python(site: SiteConfig) -> str:
    """The interpreter a batch job runs srl with: the site's ``environment.python`` when it is an absolute path (a
    site-wide install), else the interpreter running srl now (``sys.executable``: the checkout's own environment,
    which a cluster's shared filesystem makes visible on the compute nodes). Never a bare command name, which a job
    would resolve against whatever PATH it inherits."""
    import sys

    p = site.environment.python
    return p if p.startswith("/") else sys.executable
