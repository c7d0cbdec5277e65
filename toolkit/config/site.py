"""Site configs: what differs between clusters (GPU request style, accounting, ports, filesystems, modules).

A site is a TOML file in ``site-configs/`` named by ``RLConfig.site``. ``local`` means no Slurm: every process runs on
this machine. Its schema is as strict as the run config (unknown keys are errors); the checks that need the machine
itself or the run config (the kernel's ephemeral port range, accounting, ``#SBATCH`` values) are
:mod:`toolkit.preflight.site`'s, which also finds a site by name.

Light: pydantic and the standard library only (login-node safe).
"""

from __future__ import annotations

import os
import re
import sys
import tomllib
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from .errors import ConfigError, pydantic_issues
from .model import Section

# Framework defaults that srl never hands out: torchrun's master port and vLLM's HTTP port.
FORBIDDEN_PORTS = frozenset({29500, 8000})
# An absolute path of safe characters, optionally starting with one $VAR / ${VAR} expanded on the compute node.
_SCRATCH_RE = re.compile(r"(\$\{?[A-Za-z_][A-Za-z0-9_]*\}?|/)[A-Za-z0-9_./-]*")
# sbatch splits an #SBATCH line on whitespace and understands quotes and backslashes: a value holding any of them
# (or a newline, which would start a new script line) changes the options. Shared by toolkit.render and
# toolkit.preflight.site.
SBATCH_UNSAFE = re.compile(r"[\s'\"\\`]")


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
    """``$HOME`` is on a shared filesystem (NFS): never put JIT caches there."""
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


class CpusSection(Section):
    """CPU cores each node group of a job asks for (``--cpus-per-task``; srl runs one task per node, and a job step
    may use every core of its job on its nodes). Unset: no request, so the cluster's default applies, which on
    core-counting clusters (``SelectTypeParameters=CR_Core``) is often one core per task: too few for an engine's
    API server, the trainer's ranks and the orchestrator with its env workers. A ``--cpus-per-task``,
    ``--cpus-per-gpu``, ``--mincpus``, a CPU in ``--tres-per-task`` or a plain ``--exclusive`` among a run's
    ``slurm.extra_directives`` replaces this request for the job's first node group (the one they apply to)."""

    per_gpu: int | None = Field(None, ge=1, le=1024)
    """Cores per requested GPU: a group with ``g`` GPUs per node asks for ``per_gpu * g`` cores per node."""
    without_gpus: int | None = Field(None, ge=1, le=4096)
    """Cores per node of a group without GPUs (the orchestrator's own nodes, a model-free gate job, CPU sites)."""

    def per_node(self, gpus_per_node: int) -> int | None:
        """Cores to ask per node for a group with ``gpus_per_node`` GPUs per node; None: no request."""
        if gpus_per_node > 0:
            return self.per_gpu * gpus_per_node if self.per_gpu else None
        return self.without_gpus


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
    """One cluster (or ``local``). Read by :func:`read_site`."""

    name: str
    scheduler: Literal["local", "slurm"] = "slurm"
    description: str = ""
    submit_host: Literal["login", "controller"] = "login"
    """Where ``sbatch`` runs (some clusters submit from the controller node)."""
    gpu: GpuSection = GpuSection()
    accounting: AccountingSection = AccountingSection()
    partitions: PartitionsSection = PartitionsSection()
    cpus: CpusSection = CpusSection()
    ports: PortsSection = PortsSection()
    filesystem: FilesystemSection = FilesystemSection()
    environment: EnvironmentSection = EnvironmentSection()
    limits: LimitsSection = LimitsSection()
    source: Path | None = None
    """File the site was read from (filled by :func:`read_site`)."""

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", v):
            raise ValueError("site name must be letters, digits, '.', '_' or '-'")
        return v

    @property
    def is_slurm(self) -> bool:
        return self.scheduler == "slurm"


def site_configs_dir() -> Path:
    """Directory of site TOMLs: ``$SRL_SITE_CONFIGS`` or the repository's ``site-configs/``."""
    env = os.environ.get("SRL_SITE_CONFIGS")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "site-configs"


def read_site(path: Path) -> SiteConfig:
    """Read and validate the site file ``path`` against the schema (its ``name`` defaults to the file's stem).

    Raises ConfigError naming the file and field for unknown keys, bad values, or a file that is not TOML text.
    """
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    except (OSError, UnicodeDecodeError) as e:  # a directory named *.toml, unreadable, or not UTF-8 text
        raise ConfigError(f"cannot read site config {path}: {e}") from None
    raw.setdefault("name", path.stem)
    try:
        return SiteConfig.model_validate({**raw, "source": str(path)})
    except ValidationError as e:
        raise ConfigError(pydantic_issues(e, SiteConfig, source=str(path))) from None


def job_python(site: SiteConfig) -> str:
    """The interpreter a batch job runs srl with: the site's ``environment.python`` when it is an absolute path (a
    site-wide install), else the interpreter running srl now (``sys.executable``: the checkout's own environment,
    which a cluster's shared filesystem makes visible on the compute nodes). Never a bare command name, which a job
    would resolve against whatever PATH it inherits."""
    p = site.environment.python
    return p if p.startswith("/") else sys.executable
