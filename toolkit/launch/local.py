"""Local launcher: run every process of a placement plan on this machine, supervised.

The same commands and environments the Slurm templates run (from the plan) are started as child processes, each in
its own process group, with output teed to ``<run>/logs/attempt_<n>/<log_name>``. One progress line shows step,
reward and throughput from ``metrics.jsonl``. When any component exits, everything stops: exit status 0 only when
the trainer and orchestrator finished cleanly; otherwise non-zero, naming the component. The exception is an
inference engine that dies after start-up: it is restarted with the same command, environment and port up to
``inference.max_restarts`` times within ``inference.restart_window_s`` (``restarts.py`` says why only engines),
and must answer /health within ``inference.startup_timeout_s``; the orchestrator holds generation meanwhile and
loads the newest STABLE weights into it before it serves rollouts (``toolkit.orchestrator.engines``: the
orchestrator owns weight updates, so a launcher-side load would race with them). Ctrl-C (or SIGTERM) writes
the run's stop request so the trainer checkpoints, waits a bounded grace period, then stops the rest.
No orphans, whatever ends the launcher: every child is killed by process group on every exit path the launcher
lives through; when it dies without cleaning up (SIGKILL, the OOM killer), the kernel kills each direct child
(parent-death signal) and a reaper process (``procutil.GroupReaper``) kills the children's process groups (engine
workers, torchrun ranks, env workers).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from .. import lease as leases
from ..config.errors import ConfigError
from ..config.model import RLConfig
from ..fsutil import write_marker
from ..procutil import GroupReaper, kill_with_parent_preexec
from ..run import ending
from ..rundir import RunDir, point_symlink
from .progress import continue_command, write_local_record
from .restarts import RestartBudget, is_restartable

# Roles whose clean exit means the run is done; inference and router serve until told to stop.
_FINITE_ROLES = ("trainer", "orchestrator")
# Seconds between supervision polls; small so a crash ends the run promptly.
_POLL_S = 0.5


@dataclass
class _Child:
    name: str
    role: str
    proc: subprocess.Popen
    log: IO[bytes]
    returncode: int | None = None
    argv: list[str] = field(default_factory=list)  # what was started, reused verbatim by a restart
    env: dict[str, str] = field(default_factory=dict)
    health_url: str | None = None
    budget: RestartBudget | None = None
    restarted_at: float | None = None  # monotonic time of the restart still waiting for /health
    reaper: GroupReaper | None = None  # kills the child's group should the launcher die without doing so


@dataclass
class _Progress:
    """Tails metrics.jsonl and renders one status line."""

    path: Path
    offset: int = 0
    last: dict[str, Any] = field(default_factory=dict)
    shown: int = -1

    def poll(self) -> str | None:
        if not self.path.exists():
            return None
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        for line in complete.splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            self.last.setdefault(rec.get("role", "?"), {}).update(rec)
        if not complete:
            return None
        step = self.last.get("trainer", {}).get("step", 0)
        if step == self.shown:
            return None  # one line per trainer step
        self.shown = step
        o, t = self.last.get("orchestrator", {}), self.last.get("trainer", {})
        parts = [f"step {t.get('step', 0)}"]
        if "reward/all/mean" in o:
            parts.append(f"reward {o['reward/all/mean']:.3f} (orch step {o.get('step')})")
        if "loss/perplexity" in t:  # an SFT run: its loss is the signal (and its held-out loss, when measured)
            parts.append(f"loss {t['loss/mean']:.4f}")
            if "val/loss" in t:
                parts.append(f"val/loss {t['val/loss']:.4f} (step {t.get('step')})")
        evals = {k: v for k, v in o.items() if k.startswith("eval/") and k.endswith(("avg@4", "/avg@1"))}
        if evals and "reward/all/mean" not in o:
            parts += [f"{k} {v:.3f} (step {o.get('step')})" for k, v in sorted(evals.items())]
        if "perf/throughput" in t:
            parts.append(f"{t['perf/throughput']:.0f} tok/s")
        if "mismatch_kl/mean" in t:
            parts.append(f"mismatch_kl {t['mismatch_kl/mean']:.1e}")
        return " | ".join(parts)


def run_local(cfg: RLConfig, run: RunDir, plan: Any, *, attempt: int) -> int:
    """Start, supervise and stop all plan processes. Returns the exit status of how the run ended
    (``toolkit.run.ending``: 0 only when it reached max_steps; 3 when the run's lease was taken by another
    supervisor: everything is stopped at once, nothing more written), whose line it prints last.

    The launcher holds the run's lease (``toolkit.lease``; taken by ``prepare_run`` or here) for as long as it
    runs, and hands its token to every child in ``SRL_RUN_LEASE``. Raises ConfigError when another live supervisor
    holds the lease.
    """
    from ..models import resolve_model

    try:
        lease = leases.acquire(run, command="srl")
    except leases.LeaseHeld as e:
        raise ConfigError(str(e)) from None

    logs = run.log_attempt(attempt)
    logs.mkdir(parents=True, exist_ok=True)
    point_symlink(run.latest_logs, logs.name)
    model_path = str(resolve_model(cfg.model.name))
    # Every node of a local plan is this machine.
    plan.addresses = ["127.0.0.1"] * plan.num_nodes
    plan.hosts = ["localhost"] * plan.num_nodes
    print(f"srl: run directory {run.root}")
    print(f"srl: logs in {logs} ; metrics {run.metrics} ; checkpoints {run.checkpoints}")
    roles = [r for r in ("inference", "trainer", "orchestrator") if any(p.role == r for p in plan.processes)]
    print(f"srl: starting {', '.join(roles)}" + (" (vLLM start-up takes about a minute on CPU)" if "inference" in roles
          else "") + " ...", flush=True)  # fmt: skip

    children: list[_Child] = []
    stop_requested: dict[str, Any] = {"at": None, "lost": None}
    # Set from the lease's heartbeat thread; the supervision loops end the run when they see it.
    lease.on_lost(lambda why: stop_requested.__setitem__("lost", why))
    reaper = GroupReaper()

    def _on_signal(signum: int, _frame: Any) -> None:
        if stop_requested["at"] is None and stop_requested["lost"] is None:
            stop_requested["at"] = time.monotonic()
            run.control.mkdir(parents=True, exist_ok=True)
            write_marker(run.stop_request)
            print(f"\nsrl: {signal.Signals(signum).name}: asking the trainer to checkpoint and stop ...", flush=True)

    old = {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    status = 1
    failure: str | None = None  # what failed when no process did (inference never became healthy)
    write_local_record(run, attempt=attempt)  # read by `srl status`
    from ..inference.health import clear_ready

    clear_ready(run)  # an earlier attempt's URLs may point at dead engines
    from ..inference.admin_token import ADMIN_TOKEN_ENV, for_local_deployment, restore_admin_token

    # The engines' admin token (inference/guard.py), fresh per run: every child (engines, orchestrator, restarted
    # ones too) inherits it from this process's environment. An inference-only deployment also publishes it in
    # <run>/launcher/admin_token (0600) for RL runs that use it as inference.external.
    saved_token = os.environ.get(ADMIN_TOKEN_ENV)
    if any(p.role == "inference" for p in plan.processes):
        os.environ[ADMIN_TOKEN_ENV] = for_local_deployment(run, publish="orchestrator" not in plan.roles)
    try:
        from ..placement.cpus import cpu_thread_env

        # Engines and trainer get their own cores (same split as on a Slurm node; see placement/cpus.py).
        n_cores = len(os.sched_getaffinity(0))
        for spec in plan.processes:
            extra = {**cpu_thread_env(plan, spec.name, spec.node_index, n_cores), leases.LEASE_ENV: lease.token}
            children.append(_start(spec, plan, model_path, logs, extra, reaper))
        if _wait_inference(cfg, run, plan, children, stop_requested):
            status = _supervise(cfg, run, children, stop_requested)
        else:
            # Nothing was generated or trained yet, so there is nothing to checkpoint: stop at once instead of
            # waiting (up to the checkpoint grace period) for roles that are still importing torch.
            print("\nsrl: stopped before inference was ready; nothing to checkpoint", flush=True)
            status = 130
    except ComponentFailed as e:
        print(f"srl: {e}; stopping the run", file=sys.stderr, flush=True)
        status = e.child.returncode or 1
    except TimeoutError as e:
        print(f"srl: {e}", file=sys.stderr, flush=True)
        status, failure = 1, str(e)
    except LeaseLost as e:
        print(f"\nsrl: {e}; stopping every process of this attempt now", file=sys.stderr, flush=True)
        status = 3
    finally:
        lost = stop_requested["lost"] is not None
        # Decided before the teardown, whose kills would read as failures.
        try:
            end = _settle(run, children, status, stop_requested, failure)
        except OSError as e:  # a full disk must not keep the teardown from running
            end = ending.Ending(ending.FAILED, f"could not record how the run ended: {e}")
        # The run belongs to someone else once the lease is lost: no grace period, no more writes into it.
        _stop_all(children, reaper, term_wait_s=0.0 if lost else 15.0)
        reaper.close()
        restore_admin_token(saved_token)
        for s, h in old.items():
            signal.signal(s, h)
        status = end.exit_status
        if not lost:
            write_local_record(run, attempt=attempt, status=status)
        _remove_job_scratch(plan)
        lease.release()
        print(f"\n{end.line()}", flush=True)
    return status


class LeaseLost(RuntimeError):
    """The run's lease was taken over by another supervisor while this one ran."""


def _check_lease(stop: dict[str, Any]) -> None:
    if stop.get("lost") is not None:
        raise LeaseLost(f"the run lease was lost ({stop['lost']})")


def _remove_job_scratch(plan: Any) -> None:
    """Delete this attempt's JIT-cache directories (``<node_local_scratch>/srl-local-<run id>-<attempt>``, see
    ``placement.environment.srl_defaults``). On a cluster the node-local scratch goes with the job; a local attempt
    has to clean up after itself or every run leaves one behind in /tmp."""
    import shutil

    from ..placement.environment import CACHE_VARS

    dirs = {Path(p.env[k]).parent for p in plan.processes for k in CACHE_VARS if p.env.get(k)}
    for d in dirs:
        if d.name.startswith("srl-local-"):  # only what srl created for a local attempt
            shutil.rmtree(d, ignore_errors=True)


def _start(spec: Any, plan: Any, model_path: str, logs: Path, extra_env: dict[str, str] | None,
           reaper: GroupReaper) -> _Child:
    from ..placement.plan import fill

    env = dict(os.environ)
    env.update(extra_env or {})
    env.update({k: fill(v, plan, spec.node_index, model_path) for k, v in spec.env.items()})
    argv = [fill(a, plan, spec.node_index, model_path) for a in spec.command]
    if argv and argv[0] == "srl":
        # Use this interpreter's srl, whatever PATH says (a venv that is not activated).
        argv = [sys.executable, "-m", "toolkit.cli", *argv[1:]]
    elif argv and argv[0] in ("python", "python3"):
        argv = [sys.executable, *argv[1:]]
    elif argv and argv[0] == "torchrun":
        # A multi-rank trainer: torchrun's agent of this interpreter's torch (the console script may not be on
        # PATH). The agent supervises its ranks: when one dies it stops the others and exits non-zero.
        argv = [sys.executable, "-m", "torch.distributed.run", *argv[1:]]
    elif argv and argv[0] == "vllm-router":
        # The router's console script sits next to this interpreter in the venv.
        argv = [str(Path(sys.executable).with_name("vllm-router")), *argv[1:]]
    log = open(logs / spec.log_name, "ab")  # noqa: SIM115 - held open for the child's lifetime
    log.write(f"# srl: starting {spec.name}: {' '.join(argv)}\n".encode())
    log.flush()
    health = fill(spec.healthcheck_url, plan, spec.node_index) if spec.healthcheck_url else None
    return _Child(spec.name, spec.role, _spawn(argv, env, log, reaper), log, argv=argv, env=env, health_url=health,
                  reaper=reaper)  # fmt: skip


def _spawn(argv: list[str], env: dict[str, str], log: IO[bytes], reaper: GroupReaper) -> subprocess.Popen:
    """Start one child in its own process group (killed as a group on every exit path), output to ``log``.

    The child gets SIGKILL from the kernel when the launcher dies (its parent-death signal), and ``reaper`` learns
    its group, so the child's own children die with the launcher too. Call from the main thread: the parent-death
    signal follows the thread that started the child.
    """
    # preexec_fn while other threads may run: safe here, the function only makes two system calls through a ctypes
    # handle prepared in the parent; it imports nothing and takes no lock.
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True, preexec_fn=kill_with_parent_preexec())  # noqa: PLW1509
    reaper.add(proc.pid)  # a new session's group id is its leader's PID
    return proc


def _restart(cfg: RLConfig, c: _Child) -> bool:
    """Restart a dead engine ``c`` in place when its budget allows (returns True); False when it is used up."""
    inf = cfg.inference
    now = time.monotonic()
    if c.budget is None:
        c.budget = RestartBudget(inf.max_restarts, inf.restart_window_s)
    if not c.budget.try_restart(now):
        return False
    window = f" within {inf.restart_window_s:.0f} s" if inf.restart_window_s is not None else ""
    print(f"\nsrl: {c.name} exited with status {c.returncode}; restarting it (restart {c.budget.used(now)} of "
          f"{inf.max_restarts}{window}; log: {Path(c.log.name)})", file=sys.stderr, flush=True)  # fmt: skip
    # The dead leader's workers (vLLM's engine-core process) would keep memory, cores and maybe the port.
    _signal_group(c.proc, signal.SIGKILL)
    c.proc.wait()
    if c.reaper is not None:
        c.reaper.discard(c.proc.pid)
    c.log.write(f"# srl: restarting {c.name} after exit status {c.returncode}\n".encode())
    c.log.flush()
    assert c.reaper is not None
    c.proc = _spawn(c.argv, c.env, c.log, c.reaper)
    c.returncode = None
    c.restarted_at = now
    return True


def _watch_restarts(cfg: RLConfig, children: list[_Child]) -> _Child | None:
    """Restart engines that died; report restarted ones that answer /health again. Returns a child that ends the
    run (restart budget used, or not healthy within ``inference.startup_timeout_s``), else None."""
    from ..inference.health import is_healthy

    for c in children:
        if not is_restartable(c.role) or cfg.inference.max_restarts == 0:
            continue
        if c.returncode is not None:
            if not _restart(cfg, c):
                print(f"\nsrl: {c.name} exited with status {c.returncode}; restart budget used "
                      f"({cfg.inference.max_restarts} restart(s)); stopping the run", file=sys.stderr, flush=True)
                return c
        elif c.restarted_at is not None and c.health_url:
            took = time.monotonic() - c.restarted_at
            if is_healthy(c.health_url.removesuffix("/health"), timeout_s=1.0):
                c.restarted_at = None
                print(f"\nsrl: {c.name} healthy again {took:.1f} s after its restart; the orchestrator loads the "
                      "newest STABLE weights into it before it serves rollouts", flush=True)  # fmt: skip
            elif took > cfg.inference.startup_timeout_s:
                print(f"\nsrl: restarted {c.name} not healthy after {took:.0f} s; stopping the run",
                      file=sys.stderr, flush=True)  # fmt: skip
                c.returncode = c.returncode or 1
                return c
    return None


class ComponentFailed(RuntimeError):
    """A supervised process exited while the run needed it; ``child`` names it."""

    def __init__(self, child: _Child):
        self.child = child
        super().__init__(f"{child.name} exited with status {child.returncode} (log: {child.log.name})")


def _wait_inference(cfg: RLConfig, run: RunDir, plan: Any, children: list[_Child], stop: dict[str, Any]) -> bool:
    """Block until every engine (and the router) answers /health, then publish readiness for the orchestrator.
    Returns True once ready, False when a stop was requested first.

    Every child is watched meanwhile: a trainer or orchestrator that dies during the (slow) engine start-up ends the
    run at once instead of after the start-up timeout. Raises ComponentFailed or TimeoutError.
    """
    from ..inference.health import is_healthy, write_ready
    from ..placement.runtime import ready_info

    pending = {c.name: c.health_url.removesuffix("/health")
               for c in children if c.role in ("inference", "router") and c.health_url}
    n = len(pending)
    deadline = time.monotonic() + cfg.inference.startup_timeout_s
    while pending:
        for c in children:
            if c.returncode is None:
                c.returncode = c.proc.poll()
            if c.returncode is not None and (c.returncode != 0 or c.role not in _FINITE_ROLES):
                raise ComponentFailed(c)
        _check_lease(stop)
        if stop["at"] is not None:
            return False
        for name, url in list(pending.items()):
            if is_healthy(url):
                del pending[name]
        if time.monotonic() > deadline:
            raise TimeoutError(f"inference not healthy after {cfg.inference.startup_timeout_s:.0f} s: "
                               f"{sorted(pending.values())} (see logs under {run.latest_logs})")
        time.sleep(_POLL_S)
    if n:  # nothing to publish for a plan without engines (a trainer-only plan, or inference.external)
        write_ready(run, ready_info(plan, cfg.model.name))
        print(f"srl: inference ready ({n} endpoint(s))", flush=True)
    return True


def _supervise(cfg: RLConfig, run: RunDir, children: list[_Child], stop: dict[str, Any]) -> int:
    progress = _Progress(run.metrics)
    tty = sys.stdout.isatty()
    grace = cfg.slurm.checkpoint_grace_s
    while True:
        _check_lease(stop)
        line = progress.poll()
        if line:
            # One rewritten status line on a terminal; plain lines when output goes to a file or pipe.
            if tty:
                print(f"\r\x1b[2K{line}", end="", flush=True)
            else:
                print(line, flush=True)
        for c in children:
            if c.returncode is None:
                c.returncode = c.proc.poll()
        if stop["at"] is None:
            ended = _watch_restarts(cfg, children)
            if ended is not None:
                return ended.returncode or 1
        finite = [c for c in children if c.role in _FINITE_ROLES]
        failed = [c for c in children if c.returncode not in (None, 0)]
        if failed and stop["at"] is None:
            c = failed[0]
            print(f"\nsrl: {c.name} exited with status {c.returncode}; stopping the run "
                  f"(log: {Path(c.log.name)})", file=sys.stderr, flush=True)
            if c.role in _FINITE_ROLES:
                # Resume loads the newest COMPLETE checkpoint; steps after it are trained again, recorded once.
                print(f"srl: continue from the newest complete checkpoint with:\n  "
                      f"{continue_command(sys.argv, run.root.name)}", file=sys.stderr, flush=True)
            return c.returncode or 1
        if finite and all(c.returncode == 0 for c in finite):
            if stop["at"] is not None:
                print(f"\nsrl: stopped on request; continue with:\n  {continue_command(sys.argv, run.root.name)}",
                      flush=True)
                return 130
            else:
                # How it ended (max_steps or a stop criterion) is the last line run_local prints.
                print(f"\nsrl: report with: srl report {run.root}", flush=True)
            return 0
        done_other = [c for c in children if c.role not in _FINITE_ROLES and c.returncode is not None]
        if done_other and stop["at"] is None:
            c = done_other[0]
            print(f"\nsrl: {c.name} exited unexpectedly (status {c.returncode}); stopping", file=sys.stderr)
            return 1
        if stop["at"] is not None:
            if failed or all(c.returncode is not None for c in finite):
                return 130 if any(c.returncode for c in finite) else 0
            if time.monotonic() - stop["at"] > grace:
                print("\nsrl: checkpoint grace period over; stopping", file=sys.stderr)
                return 130
        time.sleep(_POLL_S)


def _settle(run: RunDir, children: list[_Child], status: int, stop: dict[str, Any], failure: str | None) -> Any:
    """Decide and record how the run ended (``toolkit.run.ending.settle``) from the supervision's outcome:
    ``status`` as supervision returned it, the children's exit statuses, a user's stop, a lost lease."""
    if stop.get("lost") is not None:
        return ending.settle(run, lease_lost=True)
    if stop.get("at") is not None:
        return ending.settle(run, user_stop=True)
    if status == 0:
        return ending.settle(run)
    bad = [c for c in children if c.returncode not in (None, 0)]
    # A server (engine, router) has no clean exit while the run needs it.
    bad += [c for c in children if c.role not in _FINITE_ROLES and c.returncode == 0]
    if bad:
        c = bad[0]
        return ending.settle(run, failed=c.name, failed_reason=f"exit status {c.returncode} (log: {c.log.name})")
    return ending.settle(run, failed="inference", failed_reason=failure or f"supervision ended with status {status}")


def _stop_all(children: list[_Child], reaper: GroupReaper | None = None, *, term_wait_s: float = 15.0) -> None:
    """SIGTERM every live child's process group, then SIGKILL what is left after ``term_wait_s`` seconds."""
    for c in children:
        if c.proc.poll() is None:
            _signal_group(c.proc, signal.SIGTERM)
    deadline = time.monotonic() + term_wait_s
    for c in children:
        try:
            c.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for c in children:
        # Kill the whole group even when the leader exited: engines fork workers that would otherwise linger.
        _signal_group(c.proc, signal.SIGKILL)
        c.proc.wait()
        if reaper is not None:
            reaper.discard(c.proc.pid)
        c.log.close()


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
