"""Node-side helpers of the Slurm batch job's supervisor (:mod:`toolkit.launch.supervisor`): resolve, exec.

:func:`resolve` runs once in the batch job, on the host side (outside any container), before anything is launched.
It expands ``SLURM_JOB_NODELIST`` (per het group when heterogeneous) in Python, without ``scontrol``, looks up each
node's routable address (``scontrol show node``'s NodeAddr when scontrol works, else the host name; never
``localhost``), fills this job's id, hosts, addresses and model path into the plan the login node built (another
port block only when every node shares this machine's address and a port is taken), writes placement.json and
ports.json and removes a stale stop request. It raises ResolveError when the host list is missing or does not match the
plan.

``python -m toolkit.placement.runtime exec --run-dir R --process NAME``
    Runs as the Slurm step of one process: fills the command's placeholders, sets ``CUDA_VISIBLE_DEVICES`` from the
    positions in the GPU set this step was granted, applies the process's environment, on CPU-only plans the
    thread split of :mod:`toolkit.placement.cpus`, and ``exec``s the program (no shell, so no value is ever
    re-parsed).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..run.layout import COMPLETE_MARKER, RunDir, numbered_steps
from .cpus import affinity_of, apply_affinity, cpu_thread_env
from .environment import visible_devices
from .plan import KV_ROLE_NAMES, Plan, build_plan, fill, read_plan, write_plan
from .ports import ports_free

if TYPE_CHECKING:
    from toolkit.config.model import RLConfig
    from toolkit.config.site import SiteConfig


_LOOPBACK = ("localhost", "127.0.0.1", "0.0.0.0", "::1", "")
# The line each node of a multi-node torchrun step writes to its own log just before it becomes torchrun: a node's
# log without it never started its torchrun (toolkit.launch.rendezvous names such nodes when the rendezvous fails).
TORCHRUN_STARTING = "starting torchrun"


def is_multinode_torchrun(spec: Any) -> bool:
    """Whether plan process ``spec`` is a torchrun step over several nodes (the only kind with a rendezvous that can
    miss a node, and whose nodes write the marker line)."""
    return bool(spec.command) and spec.command[0] == "torchrun" and spec.num_nodes > 1


def torchrun_starting_line(position: int, nodes: int, host: str) -> str:
    """The marker line of the ``position``-th node (0-based, srun's ``%t``) of a ``nodes``-node torchrun step."""
    return f"srl-runtime: trainer node {position} of {nodes} ({host}): {TORCHRUN_STARTING}"


class ResolveError(RuntimeError):
    """The allocation's hosts cannot be determined or do not match the plan."""


def _log(msg: str) -> None:
    print(f"srl-runtime: {msg}", file=sys.stderr, flush=True)


def group_hostlists(env: dict[str, str], ngroups: int) -> list[list[str]]:
    """Host names per het group from ``SLURM_JOB_NODELIST[_HET_GROUP_<g>]``, expanded in Python.

    Raises ResolveError when a variable is missing or malformed.
    """
    from ClusterShell.NodeSet import NodeSetException

    from .slurm_records import expand_nodelist

    out = []
    for g in range(ngroups):
        key = f"SLURM_JOB_NODELIST_HET_GROUP_{g}" if ngroups > 1 else "SLURM_JOB_NODELIST"
        raw = env.get(key)
        if not raw:
            raise ResolveError(f"{key} is not set: cannot tell which hosts this job got")
        try:
            hosts = expand_nodelist(raw)
        except NodeSetException as e:
            raise ResolveError(f"cannot expand {key}={raw!r}: {e}") from None
        if not hosts:
            raise ResolveError(f"{key}={raw!r} names no hosts")
        out.append(hosts)
    return out


def node_addresses(hosts: list[str]) -> list[str]:
    """Routable address per host: Slurm's NodeAddr when ``scontrol`` answers, else the host name itself."""
    addr = {h: h for h in hosts}
    try:
        proc = subprocess.run(
            ["scontrol", "show", "node", "-o", ",".join(sorted(set(hosts)))],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if proc.returncode == 0:
            from .slurm_records import parse_scontrol_record

            for line in proc.stdout.splitlines():
                rec = parse_scontrol_record(line)
                name, na = rec.get("NodeName"), rec.get("NodeAddr")
                if name in addr and na:
                    addr[name] = na
    except (OSError, subprocess.TimeoutExpired):
        pass  # no scontrol here: host names are routable on every Slurm cluster
    return [addr[h] for h in hosts]


def job_config(run: RunDir, attempt: int | None) -> tuple[RLConfig, SiteConfig]:
    """The batch job's resolved run config and site, each read once for the whole job: ``configs/attempt_<n>/
    resolved/rl.json`` and the site file the job was rendered with (``launcher/site.toml``, checked on the login
    node; else the plan's site by name). Raises ConfigError, OSError."""
    from ..config import load_resolved
    from ..config.site import read_site, site_configs_dir

    cfg = load_resolved(run.resolved("rl", attempt))
    site_file = run.launcher / "site.toml"
    site = read_site(site_file if site_file.is_file() else site_configs_dir() / f"{read_plan(run).site}.toml")
    return cfg, site


def with_job_id(plan: Plan, job_id: str) -> Plan:
    """``plan`` with its ``$SLURM_JOB_ID`` placeholders (the login node's, :func:`toolkit.placement.plan.launch_plan`)
    replaced by the job's id: the plan the job runs, not rebuilt. The placeholder is a whole token in every value
    that holds it, so a textual replacement cannot touch a port or another number."""
    text = json.dumps(plan.to_json()).replace("$SLURM_JOB_ID", job_id)
    return Plan.from_json(json.loads(text))


def resolve(run: RunDir, cfg: RLConfig, site: SiteConfig, env: dict[str, str]) -> Plan:
    """The plan for this allocation (job id, hosts, addresses), written. See module docstring.

    ``cfg``, ``site``: :func:`job_config`. The login node's plan is kept and only its job id filled in; it is
    rebuilt (same roles and port key) only for a plan that already holds another job's id (a batch script
    submitted again by hand, a requeue) or has no port key, or moved to another port block when one is busy.
    """
    job_id = env.get("SLURM_JOB_ID")
    if not job_id:
        raise ResolveError("SLURM_JOB_ID is not set: resolve runs inside the batch job")
    old = read_plan(run)
    if old.job_id == "$SLURM_JOB_ID" and old.port_key is not None:
        plan = with_job_id(old, job_id)
    else:
        plan = build_plan(cfg, site, run, job_id=job_id, roles=old.roles, port_key=old.port_key)
    groups = group_hostlists(env, len(plan.groups))
    for g, hosts in zip(plan.groups, groups):
        if len(hosts) != g.num_nodes:
            raise ResolveError(
                f"het group {g.index}: the plan needs {g.num_nodes} node(s), the allocation has "
                f"{len(hosts)} ({','.join(hosts)})"
            )
    hosts = [h for hs in groups for h in hs]
    addrs = node_addresses(hosts)
    bad = [h for h, a in zip(hosts, addrs) if a in _LOOPBACK] if len(set(addrs)) > 1 else []
    if bad:
        raise ResolveError(f"hosts {bad} resolve to a loopback address on a multi-node allocation")
    if len(set(addrs)) == 1 and addrs[0] not in ("", "0.0.0.0", "::"):
        # Every process binds on this machine (one node, or emulated nodes sharing an address): a port block that
        # another job or a local run already listens on would make an engine fail to start, so move to a free one.
        plan = _free_port_plan(cfg, site, run, plan, job_id, addrs[0])
    plan.hosts, plan.addresses = hosts, addrs
    if any("{model_path}" in a for p in plan.processes for a in p.command):
        # Once for the job, so that no step has to read the run config only to find the model.
        plan.model_path = model_path_for(cfg.model.name)
    user_master = env.get("MASTER_ADDR")
    if (
        plan.master_node is not None
        and user_master
        and user_master not in (hosts[plan.master_node], addrs[plan.master_node])
    ):
        raise ResolveError(
            f"MASTER_ADDR={user_master} is set in the job's environment but the first trainer host "
            f"is {hosts[plan.master_node]}; unset it (srl resolves the rendezvous host itself)"
        )
    write_plan(run, plan)
    run.stop_request.unlink(missing_ok=True)  # left by the previous run of a requeued job
    from ..run import ending

    ending.clear(run)  # a requeued job's previous ending (preempted)
    if any(p.role == "inference" for p in plan.processes):
        run.inference_ready.unlink(missing_ok=True)  # its URLs point at the previous allocation's engines
    return plan


def _free_port_plan(cfg, site, run: RunDir, plan: Plan, job_id: str, addr: str, tries: int = 32) -> Plan:
    """``plan``, or the same plan on another port block (keyed ``<its port key or job id>-<i>``) whose ports are
    all free on ``addr``. The plan keeps the key the login node chose, so the next resolve (a requeue) starts from
    that block again. Raises ResolveError after ``tries`` busy blocks."""
    key, base = plan.port_key, plan.port_key or job_id
    for i in range(tries):
        if i:
            plan = build_plan(cfg, site, run, job_id=job_id, roles=plan.roles, port_key=f"{base}-{i}")
            plan.port_key = key
        if ports_free(plan.ports.values(), addr):
            if i:
                _log(f"ports of block {i - 1} busy on {addr}; using ports from {plan.port_base}")
            return plan
    raise ResolveError(f"no free port block on {addr} after {tries} tries")


def shell_env(plan: Plan) -> str:
    """``launcher/job-<id>.env``: the job's hosts and rendezvous address as shell assignments (read by reports)."""
    lines = [f"SRL_JOB_HOSTS={shlex.quote(','.join(plan.hosts))}"]
    if plan.master_node is not None:
        lines.append(f"SRL_MASTER_ADDR={shlex.quote(plan.addresses[plan.master_node])}")
    return "\n".join(lines) + "\n"


def model_path_for(name: str) -> str:
    """Local directory of model ``name`` (:func:`toolkit.models.resolve.resolve_model`: a directory, an SFT run
    directory's final ``model/``, or an alias, built on first use under its lock). Raises ResolveError naming the
    model when it cannot be resolved."""
    from toolkit.models.resolve import resolve_model

    try:
        return str(resolve_model(name).absolute())
    except (FileNotFoundError, ValueError, RuntimeError) as e:
        raise ResolveError(f"cannot resolve model {name!r}: {e}") from None


def exec_process(run: RunDir, name: str, env: dict[str, str]) -> None:
    """Replace this process with plan process ``name`` on this node (see module docstring). Does not return."""
    plan = read_plan(run)
    spec = plan.process(name)
    me = env.get("SLURMD_NODENAME")
    # This step's node: the first of the process's nodes whose host is this one (the first node when unknown).
    node = next((i for i, h in enumerate(plan.hosts) if me and h == me and i in spec.node_indices), spec.node_index)
    from ..engines.multinode import node_engine_argv

    # An engine spanning several nodes: only its head node runs the API server (see engines/multinode.py).
    argv = node_engine_argv([fill(a, plan, node, plan.model_path) for a in spec.command], spec.node_indices, node)
    out = dict(env)
    for k, v in spec.env.items():
        v = fill(v, plan, node)
        if k in spec.node_expand:
            v = os.path.expandvars(v)
            Path(v).mkdir(parents=True, exist_ok=True)
        out[k] = v
    out["CUDA_VISIBLE_DEVICES"] = visible_devices(spec.gpus, env.get("CUDA_VISIBLE_DEVICES"), plan.gpus_per_node)
    out["SRL_NODE_INDEX"] = str(node)
    # CPU-only plans: engines bind their own cores, trainer ranks get the rest (nodes sharing an address share cores).
    out.update(cpu_thread_env(plan, name, node))
    apply_affinity(affinity_of(out))  # an engine's whole process tree on its own cores (placement/cpus.py)
    if is_multinode_torchrun(spec) and node in spec.node_indices:
        host = plan.hosts[node] if node < len(plan.hosts) else me or "?"
        print(torchrun_starting_line(spec.node_indices.index(node), spec.num_nodes, host), file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(argv[0], argv, out)


def newest_complete_since(run: RunDir, since: float) -> int | None:
    """Step of the newest ``checkpoints/step_*/COMPLETE`` written at or after ``since`` (epoch seconds)."""
    for step in reversed(numbered_steps(run.checkpoints)):
        marker = run.checkpoint_step(step) / COMPLETE_MARKER
        try:
            if marker.stat().st_mtime >= since:
                return step
        except FileNotFoundError:
            continue
    return None


def ready_info(plan: Plan, model: str) -> dict:
    """The readiness record (keys of ``toolkit.engines.health.write_ready``) with this allocation's addresses:
    ``base_url`` (router, else the only engine), ``router_url``, ``engine_urls``, ``roles``, ``model``,
    ``policy_version``, plus ``job_id`` and ``hosts``."""

    def base(p) -> str:
        return fill(p.healthcheck_url, plan, p.node_index).removesuffix("/health")

    engines = [p for p in plan.processes if p.role == "inference" and p.healthcheck_url]
    routers = [p for p in plan.processes if p.role == "router" and p.healthcheck_url]
    router_url = base(routers[0]) if routers else None
    return {
        "base_url": router_url or base(engines[0]),
        "router_url": router_url,
        "engine_urls": [base(p) for p in engines],
        "roles": {base(p): KV_ROLE_NAMES.get(p.kv_role, "engine") for p in engines},
        "model": model,
        "policy_version": 0,
        "job_id": plan.job_id,
        "hosts": plan.hosts,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m toolkit.placement.runtime")
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("exec")
    e.add_argument("--run-dir", required=True)
    e.add_argument("--process", required=True)
    a = ap.parse_args(argv)
    try:
        exec_process(RunDir(Path(a.run_dir)), a.process, dict(os.environ))
    except (ResolveError, KeyError, OSError) as err:
        _log(f"error: {err}")
        return 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
