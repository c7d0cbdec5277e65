"""Render sbatch scripts from a placement plan (Jinja2, StrictUndefined). Templates stay thin: every value they print
is computed here, typed and validated; no arithmetic or placement logic happens in bash.

Safety rules (each closes a way a rendered script has gone wrong on a cluster):
- ``#SBATCH`` lines are built here as whole options; each value is checked (no whitespace, quotes, backslashes or
  newlines, which would change how sbatch splits the line). Bash never executes ``#SBATCH`` lines.
- Every value printed into the script body passes the ``q`` filter (``shlex.quote``).
- GPUs are requested in exactly one form, the site's (``--gres=gpu[:type]:N``, ``--gpus-per-node=N`` or
  ``--gpus=N``); ``--account`` only on sites with accounting.
- Secrets appear by name only. A ``pre_run_command`` is written to a script file, never passed as ``bash -c``.
"""

from __future__ import annotations

import functools
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2

from .config.model import RLConfig
from .config.site import SBATCH_UNSAFE, SiteConfig, job_python
from .fsutil import atomic_write_text
from .placement.plan import Plan
from .run.layout import RunDir

TEMPLATES = Path(__file__).resolve().parents[1] / "templates"


class RenderError(ValueError):
    """A value cannot be rendered safely (the message names the field)."""


def sbatch_value(value: Any, what: str = "value") -> str:
    """Validate one ``#SBATCH`` option value. Raises RenderError naming ``what``.

    The config checks refuse the same values earlier, naming the field (``toolkit.preflight.site.sbatch_fields``).
    """
    s = str(value)
    if not s or SBATCH_UNSAFE.search(s):
        raise RenderError(f"{what} {s!r} cannot go into an #SBATCH line (no whitespace, quotes or backslashes)")
    return s


def _quote(value: Any) -> str:
    return shlex.quote(str(value))


@functools.lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader([str(TEMPLATES), "/"]),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
        # bash uses "{#" (${#array[@]}); Jinja comments get a delimiter bash never contains.
        comment_start_string="{%#",
        comment_end_string="#%}",
    )
    env.filters["q"] = _quote
    env.filters["sbatch"] = sbatch_value
    return env


def gpu_directives(site: SiteConfig, gpus_per_node: int, num_nodes: int) -> list[str]:
    """The single GPU request of one (het) group in the site's style; [] for CPU groups."""
    if gpus_per_node <= 0:
        return []
    style = site.gpu.request_style
    if style == "gres":
        typ = f"{site.gpu.gres_type}:" if site.gpu.gres_type else ""
        return [f"--gres=gpu:{typ}{gpus_per_node}"]
    if style == "gpus-per-node":
        return [f"--gpus-per-node={gpus_per_node}"]
    return [f"--gpus={gpus_per_node * num_nodes}"]


def job_name(cfg: RLConfig, suffix: str = "") -> str:
    """``slurm.job_name`` or the run name (plus ``suffix``), validated for #SBATCH."""
    return sbatch_value((cfg.slurm.job_name or cfg.run.name or "srl") + suffix, "slurm.job_name")


def common_directives(cfg: RLConfig, site: SiteConfig, run: RunDir, *, name: str) -> list[str]:
    """Directives every script carries: name, logs (absolute, append), time, account, qos, signal, extras."""
    s = cfg.slurm
    logs = sbatch_value(str(run.logs / "%x-%j.out"), "log path (output_dir / run.name)")
    d = [
        f"--job-name={name}",
        f"--output={logs}",
        f"--error={logs}",
        "--open-mode=append",
        f"--time={sbatch_value(s.time, 'slurm.time')}",
    ]
    if site.accounting.enabled and (s.account or site.accounting.default_account):
        d.append(f"--account={sbatch_value(s.account or site.accounting.default_account, 'slurm.account')}")
    optional = ("qos", "constraint", "nodelist", "exclude")
    d += [f"--{k}={sbatch_value(getattr(s, k), f'slurm.{k}')}" for k in optional if getattr(s, k)]
    if s.requeue:
        d += ["--requeue", f"--signal=B:{s.signal}@{int(s.signal_lead_s)}"]
    else:
        d.append("--no-requeue")
    return d + [sbatch_value(extra, "slurm.extra_directives entry") for extra in s.extra_directives]


def group_directives(site: SiteConfig, plan: Plan) -> list[list[str]]:
    """Per het group: nodes, one task per node, partition, GPU request, CPU request (the plan's, from the site's
    ``[cpus]``). One list when not heterogeneous."""
    out = []
    for g in plan.groups:
        d = [f"--nodes={g.num_nodes}", "--ntasks-per-node=1"]
        if g.partition:
            d.append(f"--partition={sbatch_value(g.partition, 'slurm.partition (or the site partition)')}")
        d += gpu_directives(site, g.gpus_per_node, g.num_nodes)
        if g.cpus_per_node:
            d.append(f"--cpus-per-task={g.cpus_per_node}")
        out.append(d)
    return out


@dataclass
class ScriptContext:
    """Everything a template may print. Templates get ``ctx`` (this) and ``plan``."""

    kind: str
    directives: list[list[str]]
    run_root: str
    launcher: str
    attempt: int
    python: str
    path_prepend: str | None
    modules: list[str]
    setup: list[str]
    steps: list[str] = field(default_factory=list)
    """One comment line per plan process: nodes, GPU positions, ports (only generated names and integers)."""
    step_options: list[str] = field(default_factory=list)
    """Quoted options of the supervisor line: the secret variables' names."""


def build_context(
    cfg: RLConfig, site: SiteConfig, run: RunDir, plan: Plan, *, attempt: int, kind: str = "rl"
) -> ScriptContext:
    """Compute every value the rl/inference templates print. Raises RenderError for unsafe #SBATCH values."""
    name = job_name(cfg, "" if kind == "rl" else f"-{kind}")
    groups = group_directives(site, plan)
    groups[0] = common_directives(cfg, site, run, name=name) + groups[0]
    steps = []
    for p in plan.processes:
        nodes = f"{p.node_index}" if p.num_nodes == 1 else f"{p.node_index}-{p.node_index + p.num_nodes - 1}"
        ports = " ".join(f"{k}={v}" for k, v in sorted(p.ports.items()))
        steps.append(f"{p.name}: node {nodes}, GPU positions {list(p.gpus)}, ports {ports}".rstrip())
    python = job_python(site)
    # The secret variables the job needs, by name only (sbatch propagates their values).
    secrets = set(cfg.slurm.secret_env_vars) | ({cfg.monitors.wandb.api_key_var} if cfg.monitors.wandb else set())
    return ScriptContext(
        kind=kind,
        directives=groups,
        run_root=str(run.root),
        launcher=str(run.launcher),
        attempt=attempt,
        # The interpreter's directory goes first on the job's PATH: a virtual environment's srl, torchrun and
        # vllm-router live next to its python, and the submitting shell may not have activated it.
        python=python,
        path_prepend=str(Path(python).parent) if python.startswith("/") else None,
        modules=list(site.environment.modules),
        setup=list(site.environment.setup),
        steps=steps,
        step_options=[f"--secret {_quote(n)}" for n in sorted(secrets)],
    )


def render_text(template: str | Path, ctx: ScriptContext, plan: Plan | None) -> str:
    """Render ``template`` (a name in ``templates/`` or an absolute path, e.g. ``slurm.template_path``)."""
    name = str(template)
    try:
        tpl = _env().get_template(str(Path(name).absolute()) if Path(name).is_absolute() or "/" in name else name)
    except jinja2.TemplateNotFound as e:
        raise RenderError(f"template {name} not found") from e
    try:
        return tpl.render(ctx=ctx, plan=plan)
    except jinja2.UndefinedError as e:
        raise RenderError(f"template {name}: {e}") from e


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, text)
    path.chmod(0o755)
    return path


def render_job(
    cfg: RLConfig,
    run: RunDir,
    plan: Plan,
    kind: str = "rl",
    *,
    attempt: int | None = None,
    site: SiteConfig | None = None,
) -> Path:
    """Render ``<run>/launcher/<kind>.sbatch`` (and ``pre_run.sh``, ``site.toml``) for ``plan``; returns the script
    path. ``kind``: "rl" (a whole run, or an SFT run's launch view) or "inference" (an inference-only plan, roles
    inference + router).

    ``attempt`` defaults to the run's latest config attempt; ``site`` to the plan's site. Uses
    ``slurm.template_path`` when set (rendered with the same variables). Raises RenderError.
    """
    from .preflight.site import load_site

    site = site or load_site(plan.site)
    if attempt is None:
        attempt = (run.attempts() or [1])[-1]
    ctx = build_context(cfg, site, run, plan, attempt=attempt, kind=kind)
    template = cfg.slurm.template_path or f"{kind}.sbatch.j2"
    text = render_text(template, ctx, plan)
    run.launcher.mkdir(parents=True, exist_ok=True)
    if site.source:
        atomic_write_text(run.launcher / "site.toml", Path(site.source).read_text())
    if cfg.slurm.pre_run_command:
        # The batch job's supervisor runs it from this file, so no process's command line ever carries its text.
        _write(run.launcher / "pre_run.sh", "#!/bin/bash\n" + cfg.slurm.pre_run_command + "\n")
    return _write(run.launcher / f"{kind}.sbatch", text)
