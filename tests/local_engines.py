"""Engines started directly for tests of the inference internals: one engine, several behind a router, P/D pairs.

``start_local_deployment`` starts vLLM engines (and vllm-router) as children of the test process with the same
command and environment builders as the plan (``toolkit.engines.commands``), waits for /health and can load the
newest STABLE broadcast first; ``Deployment.stop`` ends each child's process group (vLLM's worker processes too).
srl itself starts engines only through the supervisor (``toolkit.launch.local.serve_local`` and ``srl inference``
locally, the batch job's supervisor on Slurm); this fixture gives tests shapes a plan does not produce (a router in
front of one engine, a served name other than the model path).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolkit.engines.admin_token import ADMIN_TOKEN_ENV, admin_token_from_env, new_admin_token
from toolkit.engines.commands import CPU_ENGINE_DEFAULTS, ENGINE_DEFAULTS, engine_command, engine_env, router_command
from toolkit.engines.health import clear_ready, is_healthy, write_ready
from toolkit.inference.weights import WeightUpdater
from toolkit.placement.cpus import AFFINITY, OMP_THREADS, affinity_of, apply_affinity, parse_cpu_list
from toolkit.run.layout import RunDir, newest_stable_broadcast


class EngineStartError(RuntimeError):
    """An engine or router process exited, or did not answer /health in time. The message names the URL."""


def _procs_by_url(urls: Sequence[str], proc: Any) -> dict[str, subprocess.Popen]:
    if proc is None:
        return {}
    if isinstance(proc, Mapping):
        return dict(proc)
    if isinstance(proc, (list, tuple)):
        return dict(zip(urls, proc, strict=True))
    return {url: proc for url in urls}


def wait_healthy(
    urls: Sequence[str],
    timeout_s: float,
    *,
    proc: subprocess.Popen | Sequence[subprocess.Popen] | Mapping[str, subprocess.Popen] | None = None,
    interval_s: float = 0.5,
    log_paths: Mapping[str, Path] | None = None,
) -> float:
    """Block until every URL answers ``/health`` with 200; returns the seconds waited.

    ``proc`` is the process serving the URLs (one for all, one per URL in order, or a url->process mapping): if it
    exits first, EngineStartError names the URL, the exit code and (when ``log_paths`` has it) the log's tail.
    Raises EngineStartError after ``timeout_s`` seconds naming the URLs still not healthy.
    """
    t0 = time.monotonic()
    procs = _procs_by_url(urls, proc)
    pending = list(urls)
    while pending:
        for url in list(pending):
            p = procs.get(url)
            if p is not None and p.poll() is not None:
                tail = _log_tail(log_paths.get(url)) if log_paths else ""
                raise EngineStartError(f"process serving {url} exited with code {p.returncode} before healthy{tail}")
            if is_healthy(url):
                pending.remove(url)
        if not pending:
            break
        if time.monotonic() - t0 > timeout_s:
            raise EngineStartError(f"not healthy after {timeout_s:.0f} s: {', '.join(pending)}")
        time.sleep(interval_s)
    return time.monotonic() - t0


def _log_tail(path: Path | None, n_chars: int = 2000) -> str:
    if path is None:
        return ""
    with contextlib.suppress(OSError):
        text = Path(path).read_text(errors="replace")
        return f"\n--- tail of {path} ---\n{text[-n_chars:]}"
    return ""


def model_dtype(model_path: str | Path) -> str:
    """The dtype a HF model directory declares in config.json (``torch_dtype`` or ``dtype``), default "auto".

    Serving in the checkpoint's own dtype keeps sampling logprobs equal to the trainer's (fp32 tiny model: exact to
    ~1e-5). Raises nothing: an unreadable config gives "auto".
    """
    cfg = Path(model_path) / "config.json"
    try:
        data = json.loads(cfg.read_text())
    except (OSError, ValueError):
        return "auto"
    dtype = data.get("dtype") or data.get("torch_dtype") or (data.get("text_config") or {}).get("dtype")
    return str(dtype) if dtype else "auto"


def default_engine_args(model_path: str | Path, *, cpu: bool) -> dict[str, Any]:
    """Defaults under the user's ``[inference.vllm]`` table (the user's values win).

    CPU: ``CPU_ENGINE_DEFAULTS`` (no compile step, no split prefills), dtype from the model.
    Always: ``ENGINE_DEFAULTS`` (``max_logprobs`` so per-token logprobs can be requested, ``logprobs_mode`` so they
    are those of the sampling distribution, ``worker_extension_cls`` for srl's faster weight reload).
    """
    out: dict[str, Any] = dict(ENGINE_DEFAULTS)
    if cpu:
        out.update(CPU_ENGINE_DEFAULTS)
        out["dtype"] = model_dtype(model_path)
    return out


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port the OS reports free on ``host`` now (another process may take it before use; fine on one host)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def cpu_binds(n_engines: int, n_cores: int | None = None) -> list[str | None]:
    """Disjoint ``VLLM_CPU_OMP_THREADS_BIND`` core ranges for ``n_engines`` engines on this host ("0", "1" on
    two cores); ``[None]`` for one engine (vLLM picks). Raises ValueError with more engines than cores."""
    n_cores = n_cores or os.cpu_count() or 1
    if n_engines <= 1:
        return [None]
    if n_engines > n_cores:
        raise ValueError(f"{n_engines} CPU engines need at least as many cores, this host has {n_cores}")
    per = n_cores // n_engines
    out: list[str | None] = []
    for i in range(n_engines):
        lo, hi = i * per, (i + 1) * per - 1
        out.append(str(lo) if lo == hi else f"{lo}-{hi}")
    return out


@dataclass
class ManagedProcess:
    """One child process of a deployment (engine or router) with its URL, role and log file."""

    name: str
    role: str  # "engine" | "prefill" | "decode" | "router"
    url: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen | None = None
    secret_env: dict[str, str] = field(default_factory=dict, repr=False)  # the admin token: never shown

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                env={**os.environ, **self.env, **self.secret_env},
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # own process group: stop() reaches vLLM's worker processes too
                # only a system call with a set parsed before the fork (as the supervisor does): safe beside threads
                preexec_fn=functools.partial(apply_affinity, affinity_of(self.env)),  # noqa: PLW1509
            )

    def signal_group(self, sig: int) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)  # pgid == pid of a session leader

    def stop(self, grace_s: float = 30.0) -> int | None:
        """SIGTERM the process group, SIGKILL it after ``grace_s`` seconds; returns the exit code."""
        if self.proc is None:
            return None
        self.signal_group(signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.signal_group(signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.signal_group(signal.SIGKILL)  # workers that outlived their parent
        return self.proc.returncode


@dataclass
class Deployment:
    """A running local deployment. ``base_url`` is what clients call (router, or the only engine)."""

    run: RunDir
    model: str
    engines: list[ManagedProcess]
    router: ManagedProcess | None = None
    policy_version: int = 0
    kv_store: Path | None = None
    timings: dict[str, float] = field(default_factory=dict)
    admin_token: str | None = field(default=None, repr=False)  # pass to WeightUpdater; never in ready_info

    @property
    def base_url(self) -> str:
        return self.router.url if self.router else self.engines[0].url

    @property
    def engine_urls(self) -> list[str]:
        return [e.url for e in self.engines]

    def ready_info(self) -> dict[str, Any]:
        """Content of the readiness file (see ``health.write_ready``)."""
        return {
            "base_url": self.base_url,
            "router_url": self.router.url if self.router else None,
            "engine_urls": self.engine_urls,
            "roles": {e.url: e.role for e in self.engines},
            "model": self.model,
            "policy_version": self.policy_version,
            "pids": {p.name: p.proc.pid for p in self._all() if p.proc is not None},
        }

    def _all(self) -> list[ManagedProcess]:
        return ([self.router] if self.router else []) + self.engines

    def stop(self, grace_s: float = 30.0) -> None:
        """Stop the router then every engine (by process group), remove readiness, clean the P/D KV store."""
        clear_ready(self.run)
        for p in self._all():
            p.stop(grace_s)
        if self.kv_store is not None:
            shutil.rmtree(self.kv_store, ignore_errors=True)

    def __enter__(self) -> Deployment:  # noqa: PYI034 - Python 3.10 has no typing.Self
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _run_sync(coro: Any) -> Any:
    """Run a coroutine to completion from sync code, also when the caller already runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def _router_executable(python: str) -> str:
    beside = Path(python).parent / "vllm-router"
    return str(beside) if beside.exists() else (shutil.which("vllm-router") or "vllm-router")


def start_local_deployment(
    run: RunDir,
    *,
    model_path: str | Path,
    served_model_name: str,
    log_dir: Path,
    num_engines: int = 1,
    prefill_replicas: int = 0,
    decode_replicas: int = 0,
    vllm_args: Mapping[str, Any] | None = None,
    cpu: bool = True,
    host: str = "127.0.0.1",
    engine_ports: Sequence[int] | None = None,
    router_port: int | None = None,
    router_policy: str = "sticky_least_loaded",
    request_timeout_s: float = 600.0,
    health_check_interval_s: float = 5.0,
    use_router: bool | None = None,
    kv_connector: str = "ExampleConnector",
    engine_env_vars: Mapping[str, str] | None = None,
    prefill_env_vars: Mapping[str, str] | None = None,
    decode_env_vars: Mapping[str, str] | None = None,
    startup_timeout_s: float = 600.0,
    load_newest_stable: bool = True,
    python: str = sys.executable,
    admin_token: str | None = None,
) -> Deployment:
    """Start a deployment on this host and return once it serves and its readiness file is written.

    Aggregated mode: ``num_engines`` replicas behind a router (router when more than one engine, or when
    ``use_router`` is True). P/D mode: ``prefill_replicas`` > 0 and ``decode_replicas`` > 0 (then
    ``num_engines`` is ignored); KV moves through ``kv_connector`` ("ExampleConnector": files in
    ``<run>/scratch/kv_store``, removed at start and stop). On CPU each engine is pinned to its own cores. Logs go to
    ``log_dir/<name>.log``. If ``<run>/broadcasts`` holds a STABLE step, every engine loads it before readiness (a
    restarted deployment resumes the policy it served). Engines get the admin token ``admin_token``; None means this
    process's ``SRL_ADMIN_TOKEN``, created and exported here when unset, so a ``WeightUpdater`` built later in this
    process finds it (``Deployment.admin_token`` holds it too). Raises EngineStartError (naming the URL, exit code, log
    tail) or WeightUpdateError; everything started is stopped before the error propagates.
    """
    t0 = time.monotonic()
    clear_ready(run)
    pd = prefill_replicas > 0 or decode_replicas > 0
    if pd and (prefill_replicas < 1 or decode_replicas < 1):
        raise ValueError("P/D mode needs at least one prefill and one decode replica")
    roles = ["prefill"] * prefill_replicas + ["decode"] * decode_replicas if pd else ["engine"] * num_engines
    ports = list(engine_ports) if engine_ports else [free_port(host) for _ in roles]
    if len(ports) != len(roles):
        raise ValueError(f"{len(roles)} engines but {len(ports)} ports")
    binds = cpu_binds(len(roles)) if cpu else [None] * len(roles)
    defaults = default_engine_args(model_path, cpu=cpu)
    kv_store = None
    kv_extra: dict[str, Any] | None = None
    if pd and kv_connector == "ExampleConnector":
        kv_store = run.scratch / "kv_store"
        shutil.rmtree(kv_store, ignore_errors=True)  # the connector never cleans its store; it grows per prompt
        kv_store.mkdir(parents=True)
        kv_extra = {"shared_storage_path": str(kv_store)}

    token = admin_token or admin_token_from_env()
    if token is None:  # exported, so a WeightUpdater built later in this process finds it
        token = os.environ[ADMIN_TOKEN_ENV] = new_admin_token()
    engines: list[ManagedProcess] = []
    counters: dict[str, int] = {}
    user_env = {"engine": engine_env_vars, "prefill": prefill_env_vars, "decode": decode_env_vars}
    for role, port, bind in zip(roles, ports, binds, strict=True):
        i = counters[role] = counters.get(role, -1) + 1
        argv = engine_command(
            model_path=model_path,
            host=host,
            port=port,
            vllm_args=vllm_args or {},
            tp=1,
            dp=1,
            served_model_name=served_model_name,
            kv_role={"prefill": "kv_producer", "decode": "kv_consumer"}.get(role),
            kv_connector=kv_connector if pd else None,
            kv_extra=kv_extra,
            python=python,
            defaults=defaults,
        )
        env = engine_env(
            role=role,
            omp_bind=bind,
            side_channel_host=None,
            side_channel_port=None,
            cpu=cpu,
            user_env=user_env[role] or {},
        )
        if bind is not None and cpu:
            # As the launcher does (toolkit.placement.cpus): the engine's whole process tree on its cores, and as
            # many OpenMP threads as cores (a one-worker engine computes in its engine core, which vLLM does not bind).
            env.setdefault(OMP_THREADS, str(len(parse_cpu_list(bind))))
            env.setdefault(AFFINITY, bind)
        name = f"{role}_{i}"
        engines.append(
            ManagedProcess(
                name,
                role,
                f"http://{host}:{port}",
                argv,
                env,
                Path(log_dir) / f"{name}.log",
                secret_env={ADMIN_TOKEN_ENV: token},
            )
        )

    dep = Deployment(run=run, model=served_model_name, engines=engines, kv_store=kv_store, admin_token=token)
    try:
        for e in engines:
            e.start()
        dep.timings["engines_healthy_s"] = wait_healthy(
            dep.engine_urls,
            startup_timeout_s,
            proc={e.url: e.proc for e in engines},
            log_paths={e.url: e.log_path for e in engines},
        )
        if pd or use_router or (use_router is None and len(engines) > 1):
            rport = router_port or free_port(host)
            argv = router_command(
                host=host,
                port=rport,
                engine_urls=[] if pd else dep.engine_urls,
                prefill_urls=[e.url for e in engines if e.role == "prefill"] if pd else None,
                decode_urls=[e.url for e in engines if e.role == "decode"] if pd else None,
                policy=router_policy,
                request_timeout_s=request_timeout_s,
                health_check_interval_s=health_check_interval_s,
                executable=_router_executable(python),
            )
            dep.router = ManagedProcess(
                "router", "router", f"http://{host}:{rport}", argv, {}, Path(log_dir) / "router.log"
            )
            dep.router.start()
            wait_healthy([dep.router.url], 60, proc=dep.router.proc, log_paths={dep.router.url: dep.router.log_path})
        if load_newest_stable:
            newest = newest_stable_broadcast(run)
            if newest is not None:
                step, path = newest
                dep.timings["initial_reload_s"] = _run_sync(
                    WeightUpdater(dep.engine_urls, admin_token=token).update(path, step)
                )
                dep.policy_version = step
        dep.timings["startup_s"] = time.monotonic() - t0
        write_ready(run, dep.ready_info())
    except BaseException:
        dep.stop(grace_s=10)
        raise
    return dep
