"""The placement plan: every process of one RL job with its node, GPUs, ports, command and environment.

A pure function of the resolved run config, the site config and the job id (no Slurm needed): the local launcher,
the sbatch templates, the batch shell's runtime helper and offline tools all read the same plan, written to
``<run>/launcher/placement.json`` and ``ports.json``. Node arithmetic comes from :func:`derive_topology` only.

Commands may contain placeholders the launcher (or the node-side runtime, :mod:`toolkit.placement.runtime`) fills:
``{node_addr}`` (this process's node address), ``{node_addr_<N>}`` (node N's address, for references to another
node), ``{master_addr}`` (the first trainer node's address), ``{model_path}`` (``srl model path NAME``).
Locally every address is 127.0.0.1.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..config.model import RLConfig
from ..config.site import SiteConfig
from ..engines.commands import (
    CPU_ENGINE_DEFAULTS,
    ENGINE_DEFAULTS,
    LORA_ENGINE_ENV,
    CommandError,
    engine_command,
    engine_env,
    lora_engine_args,
    router_command,
)
from ..fsutil import atomic_write_json
from ..run.layout import RunDir
from . import environment as envmod
from .cpus import cpu_request
from .ports import PortAllocator, PortError, ports_free
from .topology import Topology, derive_topology

ROLES = ("inference", "router", "orchestrator", "trainer")
TEACHER_ROLE = "teacher"
"""Role of the engine serving an ``opd`` teacher the run serves itself (process ``teacher-<k>``), placed with the
orchestrator; its URL reaches the orchestrator as ``SRL_TEACHER_URL_<k>``."""
GATE_ROLE = "gate"
"""Role of the first-run gate's one process in a Slurm job (``srl eval validate|run``; process ``gate``): it reads
its command and options from the attempt's ``gate.json`` (:mod:`toolkit.evalgate`) and ends the job with the
gate's status."""
GATE_ENGINE_ROLE = "gate_engine"
"""Placed beside :data:`GATE_ROLE` when the gate serves its model itself (``srl eval run`` without ``--base-url``):
the gate process gets one GPU of its node on a site with GPUs. Not a process of its own."""
GATE_ROLES = (GATE_ROLE,)
# The engine role of each vLLM KV role (None: an aggregated engine, "engine").
KV_ROLE_NAMES = {"kv_producer": "prefill", "kv_consumer": "decode"}
# vLLM arguments the plan sets itself; stripped from the pass-through table (tp goes to engine_command's ``tp``).
_PLAN_TP_KEYS = ("tensor_parallel_size", "tensor-parallel-size", "tp")


# torchrun's own wait for the rendezvous store (``read_timeout``, 60 s by default) bounds a node's attempts to reach
# the first trainer node: measured with torch 2.13, a node that cannot reach it gives up after about twice that.
_RDZV_READ_TIMEOUT_S = 60


def rendezvous_conf(join_timeout_s: int) -> str:
    """torchrun's ``--rdzv-conf`` value for a multi-node trainer whose rendezvous must complete (or fail) within
    ``join_timeout_s`` seconds (> 0): ``join_timeout`` is how long the nodes that arrived wait for the others;
    ``read_timeout`` (the store's, torchrun's default of 60 s, lowered to half the join timeout for short ones) is
    how long a node keeps trying to reach the first trainer node, which hosts the store, so a run whose first
    trainer node is the missing one also fails within the timeout."""
    read = min(_RDZV_READ_TIMEOUT_S, max(1, join_timeout_s // 2))
    return f"join_timeout={join_timeout_s},read_timeout={read}"


class PlacementError(ValueError):
    """The config cannot be placed on this site (bad pass-through arguments, too few ports, ...)."""


@dataclass
class ProcessSpec:
    """One process (or one multi-node torchrun/engine step) of the job.

    ``node_index``: first node (position in the allocation's host list; for het group 1, positions continue after
    group 0). ``num_nodes``: nodes it spans (one Slurm task per node). ``gpus``: positions in the node's granted GPU
    list, never device ids. ``ports``: name -> port. ``command``: argv with placeholders (module docstring).
    ``env``: variables to set over the inherited environment. ``node_expand``: env keys whose ``$VAR`` is expanded on
    the node (per-job scratch). ``log_name``: file under ``<run>/logs/attempt_<n>/``; a process on several nodes
    writes one per node on Slurm, ``<stem>-<k>.log`` with k its node's position in the process (srun's ``%t``; not
    the torch rank, which the rendezvous assigns). ``healthcheck_url``: GET that
    answers 200 when ready (None for trainer/orchestrator). ``het_group``: Slurm heterogeneous component.
    """

    name: str
    role: str
    node_index: int
    gpus: tuple[int, ...]
    ports: dict[str, int]
    command: list[str]
    env: dict[str, str]
    log_name: str
    nprocs_per_node: int = 1
    num_nodes: int = 1
    healthcheck_url: str | None = None
    het_group: int = 0
    island: int | None = None
    kv_role: str | None = None
    node_expand: tuple[str, ...] = ()

    @property
    def node_indices(self) -> tuple[int, ...]:
        return tuple(range(self.node_index, self.node_index + self.num_nodes))


@dataclass
class NodeGroup:
    """Nodes of one heterogeneous component (group 0 is the whole job when not heterogeneous)."""

    index: int
    num_nodes: int
    gpus_per_node: int
    partition: str | None
    first_node: int
    cpus_per_node: int | None = None
    """Cores the group asks per node (``--cpus-per-task``, one task per node): the site's ``[cpus]``
    (:func:`toolkit.placement.cpus.cpu_request`); None: no request, the cluster's default."""


@dataclass
class Plan:
    """The placement of one job. ``processes`` are in start order. ``ports`` maps every service to its port."""

    job_id: str
    site: str
    run_dir: str
    num_nodes: int
    gpus_per_node: int
    groups: list[NodeGroup]
    processes: list[ProcessSpec]
    ports: dict[str, int]
    port_base: int
    master_node: int | None
    inference_url: str | None
    trainer_dp: int
    external_inference: str | None = None
    notes: list[str] = field(default_factory=list)
    roles: tuple[str, ...] = ROLES
    """Roles this plan places (an inference-only deployment has ("inference", "router"))."""
    hosts: list[str] = field(default_factory=list)
    """Host names per node index; filled on the allocation by :mod:`toolkit.placement.runtime` (empty before)."""
    addresses: list[str] = field(default_factory=list)
    """Routable address per node index (Slurm's NodeAddr, else the host name); filled with ``hosts``."""
    port_key: str | None = None
    """What picks the port block: a Slurm run's identity (:func:`run_port_key`), decided on the login node and
    kept by the job (which moves to another block only when a port is taken on its one machine); None: the job
    id."""
    model_path: str | None = None
    """Local directory of the run's model, for commands with ``{model_path}``: resolved once on the allocation
    (:mod:`toolkit.placement.runtime`), None before."""

    @property
    def is_het(self) -> bool:
        return len(self.groups) > 1

    def process(self, name: str) -> ProcessSpec:
        """The process called ``name``; KeyError listing the names otherwise."""
        for p in self.processes:
            if p.name == name:
                return p
        raise KeyError(f"no process {name!r} in the plan; have {[p.name for p in self.processes]}")

    def to_json(self) -> dict[str, Any]:
        """JSON-able dict (placement.json)."""
        d = asdict(self)
        d["schema"] = 1
        return d

    def ports_json(self) -> dict[str, Any]:
        """ports.json: every service's node and port, the inference URL, the rendezvous endpoint."""
        services = {
            f"{p.name}.{k}": {"node_index": p.node_index, "port": v, "process": p.name}
            for p in self.processes
            for k, v in p.ports.items()
        }
        return {
            "job_id": self.job_id,
            "port_base": self.port_base,
            "services": services,
            "inference_url": self.inference_url,
            "master_node": self.master_node,
            "trainer_dp": self.trainer_dp,
            "hosts": self.hosts,
            "addresses": self.addresses,
            "inference_url_resolved": fill(self.inference_url, self, None)
            if self.addresses and self.inference_url
            else None,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Plan:
        """Inverse of :meth:`to_json`."""
        data = dict(data)
        data.pop("schema", None)
        procs = [
            ProcessSpec(**{**p, "gpus": tuple(p["gpus"]), "node_expand": tuple(p.get("node_expand", ()))})
            for p in data.pop("processes")
        ]
        groups = [NodeGroup(**g) for g in data.pop("groups")]
        data["roles"] = tuple(data.get("roles", ROLES))
        return cls(processes=procs, groups=groups, **data)


def fill(text: str, plan: Plan, node: int | None, model_path: str | None = None) -> str:
    """Replace address placeholders in ``text`` using ``plan.addresses`` (``node`` = this process's node index).

    Raises KeyError when the plan has no addresses yet, or a placeholder needs ``model_path`` and none is given.
    """
    out = text
    if "{model_path}" in out:
        if model_path is None:
            raise KeyError("{model_path} needs the model path")
        out = out.replace("{model_path}", model_path)
    if "{node_addr" in out or "{master_addr}" in out:
        if not plan.addresses:
            raise KeyError("the plan has no node addresses yet (resolved on the allocation)")
        if plan.master_node is not None:
            out = out.replace("{master_addr}", plan.addresses[plan.master_node])
        if node is not None:
            out = out.replace("{node_addr}", plan.addresses[node])
        for i in range(len(plan.addresses) - 1, -1, -1):  # longest index first: {node_addr_12} before {node_addr_1}
            out = out.replace(f"{{node_addr_{i}}}", plan.addresses[i])
    return out


def read_plan(run: RunDir) -> Plan:
    """Load ``<run>/launcher/placement.json``."""
    return Plan.from_json(json.loads(run.placement_file.read_text()))


def write_plan(run: RunDir, plan: Plan) -> None:
    """Atomically write placement.json and ports.json under ``<run>/launcher/``."""
    run.launcher.mkdir(parents=True, exist_ok=True)
    atomic_write_json(run.placement_file, plan.to_json())
    atomic_write_json(run.ports_file, plan.ports_json())


# ---------------------------------------------------------------------------------------------------------------


@dataclass
class _Engine:
    name: str
    node: int
    nodes: int
    gpus: tuple[int, ...]
    island: int
    kv_role: str | None  # kv_producer (prefill), kv_consumer (decode), None (aggregated)
    dp: int = 1


def _engines(topo: Topology, cfg: RLConfig) -> list[_Engine]:
    """Engines per island: one per tp-slice of each node's GPUs (aggregated), or per P/D replica."""
    infer = cfg.inference.deployment
    tp, gpn, per_node = topo.infer_tp, topo.gpus_per_node, topo.engines_per_node

    def tp_slice(k: int) -> tuple[int, ...]:
        return tuple(range(k * tp, (k + 1) * tp)) if gpn else ()

    if cfg.deployment.type == "single_node":
        if infer.type == "disaggregated":  # P/D on one node: prefill engines first, then decode, tp GPUs each
            kinds = [("prefill", r, "kv_producer") for r in range(infer.num_prefill_replicas)]
            kinds += [("decode", r, "kv_consumer") for r in range(infer.num_decode_replicas)]
        else:
            kinds = [("inference", r, None) for r in range(per_node)]
        return [_Engine(f"{kind}-0-{r}", 0, 1, tp_slice(k), 0, kv) for k, (kind, r, kv) in enumerate(kinds)]
    out: list[_Engine] = []
    for isl in topo.islands:
        i = isl.index
        # (name, nodes, kv role, whether one engine spans the nodes) per replica
        if infer.type == "disaggregated":
            reps = [
                (f"{kind}-{i}-{r}", nodes, kv, len(nodes) > 1)
                for kind, replicas, kv in (
                    ("prefill", isl.prefill_nodes, "kv_producer"),
                    ("decode", isl.decode_nodes, "kv_consumer"),
                )
                for r, nodes in enumerate(replicas)
            ]
        else:
            reps = [(f"inference-{i}", isl.nodes, None, infer.type == "multi_node")]
        for name, nodes, kv, span in reps:
            if span:  # one engine spanning several nodes: data parallel over the nodes' tp slices
                out.append(_Engine(name, nodes[0], len(nodes), tuple(range(gpn)), i, kv, dp=len(nodes) * per_node))
            else:
                out += [_Engine(f"{name}-{k}", nodes[0], 1, tp_slice(k), i, kv) for k in range(per_node)]
    return out


def _router(
    cfg: RLConfig, connector: str | None, engines: list[_Engine], urls: dict[str, str], port: int, metrics_port: int
) -> list[str]:
    """vllm-router argv in front of the engines (P/D mode with prefill/decode URL lists when ``connector``, the
    deployment's KV connector, is set)."""
    r = cfg.inference.router
    common: dict[str, Any] = {
        "host": "{node_addr}",
        "port": port,
        "policy": r.policy,
        "request_timeout_s": r.request_timeout_s,
        "health_check_interval_s": r.health_check_interval_s,
        "worker_startup_timeout_s": cfg.inference.startup_timeout_s,
        "prometheus_port": metrics_port,
    }
    if connector:
        pre = [urls[e.name] for e in engines if e.kv_role == "kv_producer"]
        dec = [urls[e.name] for e in engines if e.kv_role == "kv_consumer"]
        return router_command(engine_urls=(), prefill_urls=pre, decode_urls=dec, kv_connector=connector, **common)
    return router_command(engine_urls=[urls[e.name] for e in engines], **common)


def run_port_key(cfg: RLConfig) -> str:
    """The port-block key of a Slurm run: its directory as the config names it. A dry run (of a new run or, in its
    shadow directory, of an existing one) and every submission of the run share it, so the plan written on the
    login node is the plan the job uses; the job itself only fills in its id and hosts."""
    return str(Path(cfg.output_dir).expanduser().absolute() / (cfg.run.name or ""))


def build_plan(
    cfg: RLConfig,
    site: SiteConfig,
    run: RunDir,
    *,
    job_id: str | int = "local",
    roles: tuple[str, ...] = ROLES,
    port_key: str | None = None,
) -> Plan:
    """Place every process of ``cfg`` on ``site`` for job ``job_id``. Pure: reads nothing, starts nothing.

    ``port_key`` picks the port block instead of the job id: a Slurm run's :func:`run_port_key`, so the block is
    known before the job id (the node-side resolve moves a single-machine job to another block only when something
    else already listens on its ports).
    ``roles`` restricts the plan (an inference-only deployment passes ``("inference", "router")``). With
    ``inference.external`` set no engines or router are placed; the orchestrator reads that run's router address.
    Raises TopologyError (node arithmetic), PlacementError (bad pass-through values, port range too small) and
    GpuBindingError never (GPU positions are mapped to devices on the node).
    """
    try:
        return _place(cfg, site, run, str(job_id), roles, port_key)
    except (CommandError, PortError) as err:  # bad pass-through values, too small a port range
        raise PlacementError(str(err)) from None


INFERENCE_ROLES = ("inference", "router")


LAUNCH_KINDS = {"rl": ROLES, "inference": INFERENCE_ROLES, "eval": GATE_ROLES}


def roles_of(kind: str) -> tuple[str, ...]:
    """The roles a launch of ``kind`` places: ``"rl"`` every role, ``"inference"`` engines and router, ``"eval"``
    the first-run gate. Raises ValueError for another kind."""
    if kind not in LAUNCH_KINDS:
        raise ValueError(f"unknown launch kind {kind!r}; allowed: {', '.join(LAUNCH_KINDS)}")
    return LAUNCH_KINDS[kind]


def launch_plan(
    cfg: RLConfig,
    site: SiteConfig,
    run: RunDir,
    *,
    roles: tuple[str, ...] = ROLES,
    probe: bool = False,
    tries: int = 64,
) -> Plan:
    """The plan a launch of ``run`` uses, built once (by preflight) and then written, rendered and submitted as is.

    Slurm: job id ``$SLURM_JOB_ID`` (the job fills in its id and hosts) and the run's port block
    (:func:`run_port_key`), so a dry run writes the plan a later submission uses. Local: a local run has no job id,
    so the block is keyed by the run (its ``run_meta.json`` id when it exists, else its directory name) and, with
    ``probe``, moved on until every port is free on this machine; without it a second local run would talk to the
    first run's engine. Raises PlacementError (also when no free block is found in ``tries``), TopologyError.
    """
    if site.is_slurm:
        return build_plan(cfg, site, run, job_id="$SLURM_JOB_ID", port_key=run_port_key(cfg), roles=roles)
    try:
        run_id = json.loads(run.run_meta.read_text())["run_id"]
    except (OSError, ValueError, KeyError, TypeError):
        run_id = run.root.name
    for i in range(tries):
        plan = build_plan(cfg, site, run, job_id=f"local-{run_id}-{i}", roles=roles)
        if not probe or ports_free(plan.ports.values(), "127.0.0.1"):
            return plan
    raise PlacementError(f"no free port block in the site's port range after {tries} tries; is the range too small?")


def teacher_process(k: int) -> str:
    """Plan process name of the run's ``k``-th served teacher (``RLConfig.orchestrator.served_teachers``)."""
    return f"{TEACHER_ROLE}-{k}"


@dataclass
class _Teacher:
    k: int  # its index among the run's served teachers
    served: str  # the model directory as configured (absolute): also its served model name
    node: int
    gpus: tuple[int, ...]
    het_group: int | None  # its own heterogeneous component (multi-node runs), None: on node 0 of the job


def _served_teachers(cfg: RLConfig, topo: Topology, roles: tuple[str, ...]) -> list[_Teacher]:
    """Each teacher the run serves (``RLConfig.orchestrator.served_teachers``); none when the plan places no
    orchestrator. A single-node run puts it on its node, on the GPUs after the policy's and the trainer's; a
    multi-node run gives each its own one-node heterogeneous component (``tp`` GPUs), after the job's other nodes.
    The config rules refuse a node with too few GPUs."""
    teachers = cfg.orchestrator.served_teachers() if "orchestrator" in roles else []
    dep = cfg.deployment
    first_gpu = getattr(dep, "num_infer_gpus", 0) + getattr(dep, "num_train_gpus", 0)
    next_node = topo.num_nodes + (1 if topo.orchestrator_het_group else 0)
    out = []
    for k, t in enumerate(teachers):
        n = t.tp if topo.gpus_per_node else 0
        if dep.type == "single_node":
            out.append(_Teacher(k, t.name, 0, tuple(range(first_gpu, first_gpu + n)), None))  # type: ignore[arg-type]
            first_gpu += n
        else:
            group = 1 + (1 if topo.orchestrator_het_group else 0) + k
            out.append(_Teacher(k, t.name, next_node, tuple(range(n)), group))  # type: ignore[arg-type]
            next_node += 1
    return out


def _place(
    cfg: RLConfig, site: SiteConfig, run: RunDir, job: str, roles: tuple[str, ...], port_key: str | None
) -> Plan:
    topo = derive_topology(cfg)
    dep = cfg.deployment
    gpn = dep.gpus_per_node
    root = str(run.root)
    external = cfg.inference.external
    place_inference = "inference" in roles and not external
    engines = _engines(topo, cfg) if place_inference else []
    pd = cfg.inference.deployment.type == "disaggregated"
    connector = cfg.inference.deployment.kv_connector if pd else None  # type: ignore[union-attr]
    if connector == "auto":
        connector = "NixlConnector" if gpn else "ExampleConnector"
    # Elastic replicas join and leave through the router, so an elastic run has one even with a single engine.
    elastic = getattr(cfg.deployment, "elastic", None) is not None
    use_router = place_inference and (len(engines) > 1 or pd or elastic)
    tp = topo.infer_tp

    # ---- ports: request everything per host, then assign one block for this job ------------------------------
    shared_net = site.ports.nodes_share_network or not site.is_slurm
    host = (lambda n: 0) if shared_net else (lambda n: n)
    alloc = PortAllocator(site.ports.range_start, site.ports.range_end)
    for e in engines:
        alloc.request(host(e.node), f"{e.name}.http")
        if connector == "NixlConnector":
            # vLLM offsets the side-channel port by the worker's rank, so each engine reserves one per GPU slice.
            alloc.request(host(e.node), f"{e.name}.side_channel", max(1, len(e.gpus)))
        if e.dp > 1:
            alloc.request(host(e.node), f"{e.name}.dp_rpc")
    router_node = topo.router_node if topo.router_node is not None else 0
    if use_router:
        alloc.request(host(router_node), "router.http")
        alloc.request(host(router_node), "router.metrics")
    teachers = _served_teachers(cfg, topo, roles)
    for t in teachers:
        alloc.request(host(t.node), f"{teacher_process(t.k)}.http")
    master = topo.trainer_nodes[0] if "trainer" in roles else None
    if "trainer" in roles:
        alloc.request(host(master), "trainer.rdzv")
    ports = alloc.assign(port_key or job)

    defaults = envmod.srl_defaults(site.filesystem.node_local_scratch, job, per_job=site.is_slurm)
    owned_common = {"SRL_RUN_DIR": root, "SRL_JOB_ID": job, "SRL_PORTS_FILE": str(run.ports_file)}
    procs: list[ProcessSpec] = []

    # Layers below the per-process values are shared by many processes (thousands of engines at scale): merge
    # them once per distinct combination.
    bases: dict[tuple, tuple[dict[str, str], tuple[str, ...]]] = {}

    def add(
        name: str,
        role: str,
        node: int,
        gpus: tuple[int, ...],
        pports: dict[str, int],
        command: list[str],
        component: dict[str, str],
        owned: dict[str, str],
        *,
        role_vars: dict[str, str] | None = None,
        extra_defaults: dict[str, str] | None = None,
        **kw: Any,
    ) -> None:
        key = (id(component), id(role_vars), tuple(sorted((extra_defaults or {}).items())))
        if key not in bases:
            base = envmod.layered(defaults, extra_defaults, cfg.env_vars, component, role_vars, owned_common)
            bases[key] = (base, envmod.node_expanded_keys(base, defaults))
        base, expand = bases[key]
        env = {**base, "SRL_PROCESS": name, "SRL_ROLE": role, **{k: str(v) for k, v in owned.items()}}
        procs.append(
            ProcessSpec(
                name=name,
                role=role,
                node_index=node,
                gpus=gpus,
                ports=pports,
                command=command,
                env=env,
                node_expand=expand,
                **kw,
            )
        )

    # ---- inference engines ---------------------------------------------------------------------------------
    py = site.environment.python
    vargs = {k: v for k, v in cfg.inference.vllm.items() if k not in _PLAN_TP_KEYS}
    eng_defaults: dict[str, Any] = {**ENGINE_DEFAULTS, "dtype": cfg.model.dtype}
    if not gpn:
        eng_defaults.update(CPU_ENGINE_DEFAULTS)
    lora = cfg.trainer.model.lora
    if lora is not None:  # the engines serve the trainer's adapter, loaded in place (inference.weights)
        eng_defaults.update(lora_engine_args(lora.rank))
    kv_extra = {"shared_storage_path": str(run.scratch / "kv")} if connector == "ExampleConnector" else None
    if connector == "NixlConnector" and not gpn:
        kv_extra = {"kv_buffer_device": "cpu"}
    urls: dict[str, str] = {}
    engine_kinds: dict[tuple, tuple[list[str], int, dict[str, str]]] = {}
    for e in engines:
        http = ports[f"{e.name}.http"]
        extra_args = dict(eng_defaults)
        if e.dp > 1:
            extra_args.update(
                {
                    "data_parallel_size_local": topo.engines_per_node,
                    "data_parallel_address": f"{{node_addr_{e.node}}}",
                    "data_parallel_rpc_port": ports[f"{e.name}.dp_rpc"],
                }
            )
        side = ports.get(f"{e.name}.side_channel")
        # Engines of one kind differ only in their ports: build argv/env once per kind, then set the ports.
        kind = (e.kv_role, e.dp, side is not None)
        if kind not in engine_kinds or e.dp > 1:
            cmd = engine_command(
                model_path="{model_path}",
                host="{node_addr}",
                port=http,
                vllm_args=vargs,
                tp=tp,
                dp=e.dp,
                served_model_name=cfg.model.name,
                kv_role=e.kv_role,
                kv_connector=connector,
                kv_extra=kv_extra,
                python=py,
                defaults=extra_args,
            )
            eenv = engine_env(
                role=KV_ROLE_NAMES.get(e.kv_role, "engine"),
                omp_bind=None,
                side_channel_host="{node_addr}" if side else None,
                side_channel_port=side,
                cpu=not gpn,
                user_env=LORA_ENGINE_ENV if lora is not None else None,
                workers=tp * e.dp,
            )
            engine_kinds[kind] = (cmd, cmd.index("--port") + 1, eenv)
        else:
            cmd0, at, eenv = engine_kinds[kind]
            cmd = list(cmd0)
            cmd[at] = str(http)
        owned = {k: v for k, v in eenv.items() if k in envmod.OWNED_NAMES}
        if side is not None:
            owned["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(side)
        eng_def = {k: v for k, v in eenv.items() if k not in owned}
        role_vars = None
        if pd:
            d = cfg.inference.deployment
            role_vars = d.prefill_env_vars if e.kv_role == "kv_producer" else d.decode_env_vars  # type: ignore
        pp = {k: ports[f"{e.name}.{k}"] for k in ("http", "side_channel", "dp_rpc") if f"{e.name}.{k}" in ports}
        addr = "{node_addr}" if use_router and e.node == router_node else f"{{node_addr_{e.node}}}"
        urls[e.name] = f"http://{addr}:{http}"
        add(
            e.name,
            "inference",
            e.node,
            e.gpus,
            pp,
            cmd,
            cfg.inference.env_vars,
            owned,
            role_vars=role_vars,
            extra_defaults=eng_def,
            log_name=f"{e.name}.log",
            num_nodes=e.nodes,
            healthcheck_url=f"http://{{node_addr}}:{http}/health",
            island=e.island,
            kv_role=e.kv_role,
        )

    # ---- router --------------------------------------------------------------------------------------------
    inference_url: str | None = None
    if use_router:
        rport = ports["router.http"]
        rcmd = _router(cfg, connector, engines, urls, rport, ports["router.metrics"])
        add(
            "router",
            "router",
            router_node,
            (),
            {"http": rport, "metrics": ports["router.metrics"]},
            rcmd,
            cfg.inference.env_vars,
            {},
            log_name="router.log",
            healthcheck_url=f"http://{{node_addr}}:{rport}/health",
        )
        inference_url = f"http://{{node_addr_{router_node}}}:{rport}"
    elif engines:
        e = engines[0]
        inference_url = f"http://{{node_addr_{e.node}}}:{ports[e.name + '.http']}"

    # ---- teachers the run serves (opd) ----------------------------------------------------------------------
    # The policy's engine settings minus what trains or splits it: the teacher scores the same sequences, so it
    # takes the same pass-through limits (context length, memory), but never a LoRA adapter or a KV connector.
    teacher_defaults = {**ENGINE_DEFAULTS, "dtype": cfg.model.dtype, **(CPU_ENGINE_DEFAULTS if not gpn else {})}
    for t in teachers:
        name = teacher_process(t.k)
        http = ports[f"{name}.http"]
        cmd = engine_command(
            model_path=t.served,
            host="{node_addr}",
            port=http,
            vllm_args=vargs,
            tp=max(1, len(t.gpus)),
            dp=1,
            served_model_name=t.served,
            kv_role=None,
            kv_connector=None,
            kv_extra=None,
            python=py,
            defaults=teacher_defaults,
        )
        tenv = engine_env(
            role="engine", omp_bind=None, side_channel_host=None, side_channel_port=None, cpu=not gpn, user_env=None
        )
        owned = {k: v for k, v in tenv.items() if k in envmod.OWNED_NAMES}
        add(
            name,
            TEACHER_ROLE,
            t.node,
            t.gpus,
            {"http": http},
            cmd,
            cfg.inference.env_vars,
            owned,
            extra_defaults={k: v for k, v in tenv.items() if k not in owned},
            log_name=f"{name}.log",
            healthcheck_url=f"http://{{node_addr}}:{http}/health",
            het_group=t.het_group or 0,
        )

    # ---- trainer -------------------------------------------------------------------------------------------
    if "trainer" in roles:
        if dep.type == "single_node":
            nproc = max(1, dep.num_train_gpus) if gpn else dep.cpu_train_ranks
            tgpus = tuple(range(dep.num_infer_gpus, dep.num_infer_gpus + dep.num_train_gpus)) if gpn else ()
            tnodes = 1
            conf: list[str] = []  # one node: nobody to wait for
        else:
            nproc = max(1, gpn)
            tgpus = tuple(range(gpn))
            tnodes = len(topo.trainer_nodes)
            # A node that never joins ends the rendezvous within the deployment's timeout, naming it
            # (toolkit.launch.rendezvous).
            conf = ["--rdzv-conf", rendezvous_conf(dep.trainer_rendezvous_timeout_s)] if tnodes > 1 else []
        rdzv = ports["trainer.rdzv"]
        if nproc * tnodes > 1:
            tcmd = [
                "torchrun",
                "--nnodes",
                str(tnodes),
                "--nproc-per-node",
                str(nproc),
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                f"{{master_addr}}:{rdzv}",
                "--rdzv-id",
                f"srl-{job}",
                *conf,
                "-m",
                "toolkit.trainer.main",
                "--run-dir",
                root,
            ]
        else:
            tcmd = ["srl", "trainer", "--run-dir", root]
        add(
            "trainer",
            "trainer",
            topo.trainer_nodes[0],
            tgpus,
            {"rdzv": rdzv},
            tcmd,
            cfg.trainer.env_vars,
            {"MASTER_ADDR": "{master_addr}", "MASTER_PORT": str(rdzv), "SRL_TRAINER_DP": str(topo.trainer_dp)},
            log_name="trainer.log",
            nprocs_per_node=nproc,
            num_nodes=tnodes,
        )

    # ---- orchestrator --------------------------------------------------------------------------------------
    if "orchestrator" in roles:
        onode = topo.orchestrator_node
        owned = {"SRL_TRAINER_DP": str(topo.trainer_dp)}
        if inference_url:
            owned["SRL_INFERENCE_URL"] = inference_url.replace(f"{{node_addr_{onode}}}", "{node_addr}")
        if external:
            owned["SRL_INFERENCE_RUN_DIR"] = str(Path(external).absolute())
        add(
            "orchestrator",
            "orchestrator",
            onode,
            (),
            {},
            ["srl", "orchestrator", "--run-dir", root],
            cfg.orchestrator.env_vars,
            owned,
            log_name="orchestrator.log",
            het_group=topo.orchestrator_het_group,
        )

    # ---- first-run gate -------------------------------------------------------------------------------------
    gate_gpus: tuple[int, ...] = ()
    if GATE_ROLE in roles:
        gate_gpus = (0,) if GATE_ENGINE_ROLE in roles and site.gpu.gpus_per_node > 0 else ()
        gate_cmd = ["srl", "eval", "job", "--run-dir", root]
        add("gate", GATE_ROLE, 0, gate_gpus, {}, gate_cmd, cfg.orchestrator.env_vars, {}, log_name="gate.log")

    # ---- groups --------------------------------------------------------------------------------------------
    part = cfg.slurm.partition or site.partitions.default
    groups = [NodeGroup(0, topo.num_nodes, gpn, part, 0)]
    if topo.orchestrator_het_group and "orchestrator" in roles:
        groups.append(
            NodeGroup(
                1,
                1,
                0,
                dep.orchestrator_partition or site.partitions.cpu,  # type: ignore
                topo.num_nodes,
            )
        )
    for t in teachers:
        if t.het_group is not None:
            groups.append(NodeGroup(t.het_group, 1, len(t.gpus), part, t.node))
    if (external or "inference" not in roles and "trainer" in roles) and dep.type == "multi_node":
        # The inference islands live in another allocation (or a trainer-only plan, an SFT run, has none): drop
        # their nodes and shift the others down.
        shift = len(topo.inference_nodes)
        for p in procs:
            p.node_index = max(0, p.node_index - shift)
        master = None if master is None else master - shift
        groups[0].num_nodes -= shift
        for g in groups[1:]:
            g.first_node -= shift
    # Each teacher's address names its node, so it is set once the nodes are final.
    orch = next((p for p in procs if p.role == "orchestrator"), None)
    for t in teachers:  # none without an orchestrator
        spec = next(p for p in procs if p.name == teacher_process(t.k))
        orch.env[f"SRL_TEACHER_URL_{t.k}"] = f"http://{{node_addr_{spec.node_index}}}:{spec.ports['http']}/v1"
    used = {n for p in procs for n in p.node_indices}
    if GATE_ROLE in roles:
        # One process on one node, whatever the run it gates needs: CPUs (the site's CPU partition) unless it
        # serves its model itself.
        gpart = part if gate_gpus else cfg.slurm.partition or site.partitions.cpu or site.partitions.default
        groups = [NodeGroup(0, 1, len(gate_gpus), gpart, 0)]
        master = None
    elif set(roles) != set(ROLES) and not external and used:
        # An inference-only plan asks for the nodes it uses (the islands), not the trainer's.
        groups[0].num_nodes = max(n for n in used if n < topo.num_nodes) + 1
    for g in groups:
        g.cpus_per_node = cpu_request(site, g.gpus_per_node, cfg.slurm.extra_directives if g.index == 0 else ())
    return Plan(
        job_id=job,
        site=site.name,
        run_dir=root,
        num_nodes=groups[0].num_nodes,
        gpus_per_node=groups[0].gpus_per_node if GATE_ROLE in roles else gpn,
        groups=groups,
        processes=procs,
        roles=tuple(roles),
        ports=ports,
        port_base=alloc.base or 0,
        master_node=master,
        inference_url=inference_url,
        trainer_dp=topo.trainer_dp,
        external_inference=str(Path(external).absolute()) if external else None,
        port_key=port_key,
    )
