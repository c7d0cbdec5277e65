"""Node-side helpers the batch script calls, so the script itself holds no logic: resolve, exec, waits.

``python -m toolkit.placement.runtime resolve --run-dir R --attempt N --env-file F``
    Runs once in the batch shell, on the host side (outside any container), before anything is launched. Expands
    ``SLURM_JOB_NODELIST`` (per het group when heterogeneous) in Python, without ``scontrol`` (field case B07),
    looks up each node's routable address (``scontrol show node``'s NodeAddr when scontrol works, else the host
    name; never ``localhost``), rebuilds the plan for this job id with the roles and port block the login node chose
    (another block only when every node shares this machine's address and a port is taken), writes placement.json and
    ports.json, removes a stale stop request, and writes a shell file with ``SRL_MASTER_ADDR``. Exits 1 with a
    message when the host list is missing or does not match the plan.
``python -m toolkit.placement.runtime exec --run-dir R --process NAME``
    Runs as the Slurm step of one process: fills the command's placeholders, sets ``CUDA_VISIBLE_DEVICES`` from the
    positions in the GPU set this step was granted (B03), applies the process's environment, on CPU-only plans the
    thread split of :mod:`toolkit.placement.cpus`, and ``exec``s the program (no shell, so no value is ever
    re-parsed).
``wait-checkpoint --run-dir R --since EPOCH --timeout S``: exit 0 once a ``checkpoints/step_*/COMPLETE`` marker
    newer than EPOCH exists, 1 after S seconds.
``wait-file --path P --timeout S``: exit 0 once P exists, 1 after S seconds (an external inference deployment).
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from ..fsutil import atomic_write_text
from ..rundir import RunDir, numbered_steps
from .cpus import cpu_thread_env
from .environment import visible_devices
from .plan import Plan, build_plan, fill, read_plan, write_plan
from .ports import ports_free

_LOOPBACK = ("localhost", "127.0.0.1", "0.0.0.0", "::1", "")


class ResolveError(RuntimeError):
    """The allocation's hosts cannot be determined or do not match the plan."""


def _log(msg: str) -> None:
    print(f"srl-runtime: {msg}", file=sys.stderr, flush=True)


def group_hostlists(env: dict[str, str], ngroups: int) -> list[list[str]]:
    """Host names per het group from ``SLURM_JOB_NODELIST[_HET_GROUP_<g>]``, expanded in Python.

    Raises ResolveError when a variable is missing or malformed.
    """
    from ClusterShell.NodeSet import NodeSetException

    from ..launch.slurm import expand_nodelist

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
        proc = subprocess.run(["scontrol", "show", "node", "-o", ",".join(sorted(set(hosts)))], capture_output=True,
                              text=True, timeout=30, check=False)
        if proc.returncode == 0:
            from ..launch.slurm import parse_scontrol_record

            for line in proc.stdout.splitlines():
                rec = parse_scontrol_record(line)
                name, na = rec.get("NodeName"), rec.get("NodeAddr")
                if name in addr and na:
                    addr[name] = na
    except (OSError, subprocess.TimeoutExpired):
        pass  # no scontrol here: host names are routable on every Slurm cluster
    return [addr[h] for h in hosts]


def resolve(run: RunDir, attempt: int | None, env: dict[str, str]) -> Plan:
    """Rebuild the plan for this allocation (job id, hosts, addresses) and write it. See module docstring."""
    from ..config import load_resolved
    from ..preflight.site import load_site

    job_id = env.get("SLURM_JOB_ID")
    if not job_id:
        raise ResolveError("SLURM_JOB_ID is not set: resolve runs inside the batch job")
    old = read_plan(run)
    cfg = load_resolved(run.resolved("rl", attempt))
    site_file = run.launcher / "site.toml"
    site = load_site(site_file if site_file.exists() else old.site)
    plan = build_plan(cfg, site, run, job_id=job_id, roles=old.roles, port_key=old.port_key)
    groups = group_hostlists(env, len(plan.groups))
    for g, hosts in zip(plan.groups, groups):
        if len(hosts) != g.num_nodes:
            raise ResolveError(f"het group {g.index}: the plan needs {g.num_nodes} node(s), the allocation has "
                               f"{len(hosts)} ({','.join(hosts)})")
    hosts = [h for hs in groups for h in hs]
    addrs = node_addresses(hosts)
    if len(hosts) > 1:
        bad = [h for h, a in zip(hosts, addrs) if a in _LOOPBACK and len(set(addrs)) > 1]
        if bad:
            raise ResolveError(f"hosts {bad} resolve to a loopback address on a multi-node allocation")
    if len(set(addrs)) == 1 and addrs[0] not in ("", "0.0.0.0", "::"):
        # Every process binds on this machine (one node, or emulated nodes sharing an address): a port block that
        # another job or a local run already listens on would make an engine fail to start, so move to a free one.
        plan = _free_port_plan(cfg, site, run, plan, job_id, addrs[0])
    plan.hosts, plan.addresses = hosts, addrs
    user_master = env.get("MASTER_ADDR")
    if plan.master_node is not None and user_master and user_master not in (hosts[plan.master_node],
                                                                             addrs[plan.master_node]):
        raise ResolveError(f"MASTER_ADDR={user_master} is set in the job's environment but the first trainer host "
                           f"is {hosts[plan.master_node]}; unset it (srl resolves the rendezvous host itself)")
    write_plan(run, plan)
    if run.stop_request.exists():
        run.stop_request.unlink()  # left by the previous run of a requeued job
    from ..run import ending

    ending.clear(run)  # a requeued job's previous ending (preempted)
    if any(p.role == "inference" for p in plan.processes) and run.inference_ready.exists():
        run.inference_ready.unlink()  # its URLs point at the previous allocation's engines
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


def _shell_env(plan: Plan) -> str:
    lines = [f"SRL_JOB_HOSTS={shlex.quote(','.join(plan.hosts))}"]
    if plan.master_node is not None:
        lines.append(f"SRL_MASTER_ADDR={shlex.quote(plan.addresses[plan.master_node])}")
    return "\n".join(lines) + "\n"


def model_path_for(name: str) -> str:
    """Local directory of model ``name``: a directory (an SFT run directory gives its final ``model/``), else
    ``srl model path NAME``. Raises FileNotFoundError for a directory that holds no model."""
    if Path(name).is_dir():
        from toolkit.models.resolve import resolve_model  # directories only: imports nothing heavy

        return str(resolve_model(name).absolute())
    # This interpreter's srl (the venv's), whatever PATH holds on the node.
    proc = subprocess.run([sys.executable, "-m", "toolkit.cli", "model", "path", name], capture_output=True,
                          text=True, timeout=600, check=False)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise ResolveError(f"cannot resolve model {name!r}: `srl model path` said: {proc.stderr.strip()}")
    return proc.stdout.strip().splitlines()[-1]


def exec_process(run: RunDir, name: str, env: dict[str, str]) -> None:
    """Replace this process with plan process ``name`` on this node (see module docstring). Does not return."""
    plan = read_plan(run)
    spec = plan.process(name)
    me = env.get("SLURMD_NODENAME")
    node = spec.node_index
    if me and me in plan.hosts:
        cands = [i for i, h in enumerate(plan.hosts) if h == me and i in spec.node_indices]
        node = cands[0] if cands else node
    model = None
    if any("{model_path}" in a for a in spec.command):
        from ..config import load_resolved

        model = model_path_for(load_resolved(run.resolved("rl")).model.name)
    from ..inference.multinode import node_engine_argv

    # An engine spanning several nodes: only its head node runs the API server (see inference/multinode.py).
    argv = node_engine_argv([fill(a, plan, node, model) for a in spec.command], spec.node_indices, node)
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
    out.update(cpu_thread_env(plan, name, node, len(os.sched_getaffinity(0))))
    sys.stdout.flush()
    os.execvpe(argv[0], argv, out)


def newest_complete_since(run: RunDir, since: float) -> int | None:
    """Step of the newest ``checkpoints/step_*/COMPLETE`` written at or after ``since`` (epoch seconds)."""
    for step in reversed(numbered_steps(run.checkpoints)):
        marker = run.checkpoint_step(step) / "COMPLETE"
        try:
            if marker.stat().st_mtime >= since:
                return step
        except FileNotFoundError:
            continue
    return None


def _wait(check, timeout_s: float, poll_s: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        if check():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)


def ready_info(plan: Plan, model: str) -> dict:
    """The readiness record (keys of ``toolkit.inference.health.write_ready``) with this allocation's addresses:
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
        "roles": {base(p): {"kv_producer": "prefill", "kv_consumer": "decode"}.get(p.kv_role or "", "engine")
                  for p in engines},
        "model": model,
        "policy_version": 0,
        "job_id": plan.job_id,
        "hosts": plan.hosts,
    }


def publish_ready(run: RunDir, timeout_s: float) -> bool:
    """Wait until every engine and the router answer their health URL, then write ``control/inference_ready.json``
    (:func:`ready_info`) atomically. Returns False after ``timeout_s`` seconds without all of them."""
    import urllib.request

    from ..config import load_resolved
    from ..inference.health import write_ready

    plan = read_plan(run)
    urls = [fill(p.healthcheck_url, plan, p.node_index) for p in plan.processes if p.healthcheck_url]

    def healthy(url: str) -> bool:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                return r.status == 200
        except OSError:
            return False

    if not _wait(lambda: all(healthy(u) for u in urls), timeout_s, poll_s=2.0):
        return False
    write_ready(run, ready_info(plan, load_resolved(run.resolved("rl")).model.name))
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m toolkit.placement.runtime")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("resolve")
    r.add_argument("--run-dir", required=True)
    r.add_argument("--attempt", type=int)
    r.add_argument("--env-file", required=True)
    e = sub.add_parser("exec")
    e.add_argument("--run-dir", required=True)
    e.add_argument("--process", required=True)
    w = sub.add_parser("wait-checkpoint")
    w.add_argument("--run-dir", required=True)
    w.add_argument("--since", type=float, required=True)
    w.add_argument("--timeout", type=float, required=True)
    f = sub.add_parser("wait-file")
    f.add_argument("--path", required=True)
    f.add_argument("--timeout", type=float, required=True)
    pr = sub.add_parser("publish-ready")
    pr.add_argument("--run-dir", required=True)
    pr.add_argument("--timeout", type=float, required=True)
    a = ap.parse_args(argv)
    env = dict(os.environ)
    try:
        if a.cmd == "resolve":
            run = RunDir(Path(a.run_dir))
            plan = resolve(run, a.attempt, env)
            atomic_write_text(Path(a.env_file), _shell_env(plan))
            for p in plan.processes:
                hosts = ",".join(plan.hosts[i] for i in p.node_indices)
                _log(f"{p.name}: nodes {list(p.node_indices)} ({hosts}) gpus {list(p.gpus)} ports {p.ports}")
            return 0
        if a.cmd == "exec":
            exec_process(RunDir(Path(a.run_dir)), a.process, env)
        if a.cmd == "wait-checkpoint":
            run = RunDir(Path(a.run_dir))
            ok = _wait(lambda: newest_complete_since(run, a.since) is not None, a.timeout)
            _log(f"checkpoint {'complete' if ok else f'not complete after {a.timeout:g} s'}")
            return 0 if ok else 1
        if a.cmd == "publish-ready":
            ok = publish_ready(RunDir(Path(a.run_dir)), a.timeout)
            _log("inference ready" if ok else f"inference not healthy after {a.timeout:g} s")
            return 0 if ok else 1
        if a.cmd == "wait-file":
            ok = _wait(lambda: Path(a.path).exists(), a.timeout)
            if not ok:
                _log(f"{a.path} did not appear within {a.timeout:g} s")
            return 0 if ok else 1
    except (ResolveError, KeyError, OSError) as err:
        _log(f"error: {err}")
        return 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
