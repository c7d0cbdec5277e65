"""Local launcher: run every process of a placement plan on this machine, supervised by
:class:`toolkit.launch.supervisor.Supervisor` (the same supervisor the Slurm batch job runs).

The same commands and environments the Slurm templates run (from the plan) are started as child processes, each in
its own process group, with output teed to ``<run>/logs/attempt_<n>/<log_name>``. One progress line shows step,
reward and throughput from ``metrics.jsonl``. The run ends, and an inference engine that dies after start-up is
restarted, exactly as in a batch job (the rules: :mod:`toolkit.launch.supervisor`); the exit status says how it
ended (``toolkit.run.ending``). A restarted engine gets the newest STABLE weights from the orchestrator before it
serves rollouts (``toolkit.orchestrator.engines``: the orchestrator owns weight updates, so a launcher-side load
would race with them). Ctrl-C (or SIGTERM) writes the run's stop request so the trainer checkpoints, waits the
same bounded grace period, then stops the rest.
No orphans, whatever ends the launcher: every child is killed by process group on every exit path the launcher
lives through; when it dies without cleaning up (SIGKILL, the OOM killer), the kernel kills each direct child
(parent-death signal) and a reaper process (``procutil.GroupReaper``) kills the children's process groups (engine
workers, torchrun ranks, env workers).

:func:`serve_local` starts only a config's engines (and router) the same way, for a block of code: the eval gate's
local server.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import lease as leases
from ..config.errors import ConfigError
from ..config.model import RLConfig
from ..engines.admin_token import ADMIN_TOKEN_ENV, for_local_deployment, restore_admin_token
from ..engines.health import clear_ready
from ..run import ending, metrics
from ..run.launcher import write_local_record
from ..run.layout import RunDir, point_symlink
from .progress import continue_command
from .supervisor import FINITE_ROLES, Child, ComponentFailed, LeaseLost, Supervisor

if TYPE_CHECKING:
    from toolkit.config.site import SiteConfig
    from toolkit.placement.plan import Plan


# What a plan command's first word runs here: this interpreter's programs, whatever PATH says (a venv that is not
# activated).
_PROGRAMS = {
    "srl": [sys.executable, "-m", "toolkit.cli"],
    "python": [sys.executable],
    "python3": [sys.executable],
    # A multi-rank trainer: torchrun's agent of this interpreter's torch (the console script may not be on PATH).
    # The agent supervises its ranks: when one dies it stops the others and exits non-zero.
    "torchrun": [sys.executable, "-m", "torch.distributed.run"],
    # The router's console script sits next to this interpreter in the venv.
    "vllm-router": [str(Path(sys.executable).with_name("vllm-router"))],
}


class _Progress:
    """Follows metrics.jsonl and renders one status line per trainer step: every step gets its line, however many
    records arrived between two polls (a slow poll on a busy machine once showed only the newest)."""

    def __init__(self, path: Path) -> None:
        self.follower = metrics.Follower(path)
        self.last: dict[str, dict[str, Any]] = {}
        self.shown: Any = None

    def poll(self) -> list[str]:
        """The lines of the trainer steps recorded since the last poll, oldest first; each shows the other roles'
        newest values as of that step's record (so the lines do not depend on when the polls fell)."""
        lines = []
        for rec in self.follower.new():
            role = rec.get("role", "?")
            self.last.setdefault(role, {}).update(rec)
            if role == metrics.TRAINER and rec.get("step") != self.shown:
                self.shown = rec.get("step")
                lines.append(self._line())
        return lines

    def _line(self) -> str:
        o, t = self.last.get(metrics.ORCHESTRATOR, {}), self.last.get(metrics.TRAINER, {})
        parts = [f"step {t.get('step', 0)}"]
        if metrics.REWARD_MEAN in o:
            parts.append(f"reward {o[metrics.REWARD_MEAN]:.3f} (orch step {o.get('step')})")
        if "loss/perplexity" in t:  # an SFT run: its loss is the signal (and its held-out loss, when measured)
            parts.append(f"loss {t['loss/mean']:.4f}")
            if "val/loss" in t:
                parts.append(f"val/loss {t['val/loss']:.4f} (step {t.get('step')})")
        evals = {k: v for k, v in o.items() if k.startswith("eval/") and k.endswith(("avg@4", "/avg@1"))}
        if evals and metrics.REWARD_MEAN not in o:
            parts += [f"{k} {v:.3f} (step {o.get('step')})" for k, v in sorted(evals.items())]
        if "perf/throughput" in t:
            parts.append(f"{t['perf/throughput']:.0f} tok/s")
        if "mismatch_kl/mean" in t:
            parts.append(f"mismatch_kl {t['mismatch_kl/mean']:.1e}")
        return " | ".join(parts)

    def show(self) -> None:
        """Print the new steps' lines, if any: rewritten in place on a terminal, one line per step otherwise (a
        file, a pipe: the log keeps every step)."""
        for line in self.poll():
            if sys.stdout.isatty():
                print(f"\r\x1b[2K{line}", end="", flush=True)
            else:
                print(line, flush=True)


def run_local(cfg: RLConfig, run: RunDir, plan: Plan, *, attempt: int) -> int:
    """Start, supervise and stop all plan processes. Returns the exit status of how the run ended
    (``toolkit.run.ending``: 0 only when it reached max_steps; 3 when the run's lease was taken by another
    supervisor: everything is stopped at once, nothing more written), whose line it prints last.

    The launcher holds the run's lease (``toolkit.lease``; taken by ``prepare_run`` or here) for as long as it
    runs, and hands its token to every child in ``SRL_RUN_LEASE``. Raises ConfigError when another live supervisor
    holds the lease.
    """
    from ..models import resolve_model

    _on_this_machine(plan)
    try:
        lease = leases.acquire(run, command="srl")
    except leases.LeaseHeld as e:
        raise ConfigError(str(e)) from None

    logs = run.log_attempt(attempt)
    logs.mkdir(parents=True, exist_ok=True)
    point_symlink(run.latest_logs, logs.name)
    model_path = str(resolve_model(cfg.model.name))
    print(f"srl: run directory {run.root}")
    print(f"srl: logs in {logs} ; metrics {run.metrics} ; checkpoints {run.checkpoints}")
    roles = [r for r in ("inference", "teacher", "trainer", "orchestrator") if any(p.role == r for p in plan.processes)]
    print(
        f"srl: starting {', '.join(roles)}"
        + (" (vLLM start-up takes about a minute on CPU)" if "inference" in roles else "")
        + " ...",
        flush=True,
    )

    sup = Supervisor(cfg, run, plan, say=_say, own_groups=True)
    # Set from the lease's heartbeat thread; the supervision loops end the run when they see it.
    sup.watch_lease(lease)

    def _on_signal(signum: int) -> None:
        sup.request_stop()
        print(f"\nsrl: {signal.Signals(signum).name}: asking the trainer to checkpoint and stop ...", flush=True)

    old = sup.handle_signals((signal.SIGINT, signal.SIGTERM), _on_signal)
    progress = _Progress(run.metrics)
    first: Child | None = None
    failure = "the launcher stopped before the run started"  # why, when no process ended it
    write_local_record(run, attempt=attempt)  # read by `srl status`
    # An inference-only deployment publishes its admin token for the RL runs that use it as inference.external.
    saved_token = _export_admin_token(run, plan, publish="orchestrator" not in plan.roles)
    try:
        _start_all(sup, plan, model_path, logs, {leases.LEASE_ENV: lease.token})
        if sup.wait_ready(interrupt=lambda: sup.stop_at is not None):
            first = sup.watch(on_poll=progress.show)
        else:
            print("\nsrl: stopped before inference was ready; nothing to checkpoint", flush=True)
    except ComponentFailed as e:
        first = e.child
    except TimeoutError as e:
        print(f"srl: {e}", file=sys.stderr, flush=True)
        failure = str(e)
    except LeaseLost as e:
        print(f"\nsrl: {e}; stopping every process of this attempt now", file=sys.stderr, flush=True)
    finally:
        progress.show()  # the steps recorded after the last poll
        end = _end(sup, first, failure)
        progress.show()  # and those of the final checkpointing, when the run was stopped
        restore_admin_token(saved_token)
        sup.restore_signals(old)
        if sup.lost is None:
            write_local_record(run, attempt=attempt, status=end.exit_status)
        lease.release()
        print(f"\n{end.line()}", flush=True)
    return end.exit_status


def _end(sup: Supervisor, first: Child | None, failure: str) -> Any:
    """Stop every process and return how the run ended (:mod:`toolkit.run.ending`): a lost lease (no grace, nothing
    more written: the run is someone else's), a user's stop (the trainer gets ``slurm.checkpoint_grace_s`` to
    checkpoint), else :meth:`Supervisor.end` after ``first`` (None: ``failure``)."""
    try:
        if sup.lost is not None:
            sup.stop_all(term_wait_s=0.0)
            return ending.settle(sup.run, lease_lost=True)
        if sup.stop_at is not None:
            sup.stop_after()  # decided after: the trainer's last checkpointed step is the run's
            end = ending.settle(sup.run, user_stop=True)
            print(
                f"\nsrl: stopped on request; continue with:\n  {continue_command(sys.argv, sup.run.root.name)}",
                flush=True,
            )
            return end
        if sup.stall is not None:
            _say(
                f"the watchdog stopped the run: {sup.stall.message()}; the stuck processes' stacks (or their "
                f"state) are in {sup.run.latest_logs}/watchdog.log and their own logs. Continue from the newest "
                f"complete checkpoint with:\n  {continue_command(sys.argv, sup.run.root.name)}",
                error=True,
            )
        elif first is not None and first.returncode != 0:
            _say(
                f"{first.name} exited with status {first.returncode}; stopping the run (log: {first.log_path})",
                error=True,
            )
            end = sup.end(first)
            if end.exception:
                _say(f"{first.name} raised {end.exception}" + (f" at {end.where}" if end.where else ""), error=True)
            if first.role in FINITE_ROLES and end.resume_helps:
                # Resume loads the newest COMPLETE checkpoint; steps after it are trained again, recorded once.
                _say(
                    f"continue from the newest complete checkpoint with:\n  "
                    f"{continue_command(sys.argv, sup.run.root.name)}",
                    error=True,
                )
            elif first.role in FINITE_ROLES:
                _say(
                    "a resume would raise it again: fix what it names (the config, the env's module or the data) first",
                    error=True,
                )
            return end
        elif first is not None and first.role in FINITE_ROLES:
            _say(f"report with: srl report {sup.run.root}")
        return sup.end(first, reason=None if first else failure)
    except OSError as e:  # a full disk must not keep the teardown from running
        sup.stop_all()
        return ending.Ending(ending.FAILED, f"could not record how the run ended: {e}")


def _say(text: str, *, error: bool = False) -> None:
    print(f"\nsrl: {text}", file=sys.stderr if error else sys.stdout, flush=True)


def _on_this_machine(plan: Plan) -> None:
    """Make every node of a local plan this machine, and check its JIT-cache directory: local caches persist
    between runs under a predictable name (``placement.environment.srl_defaults``), so it is refused, before
    anything starts, unless it is this user's alone. Raises ConfigError naming the directory."""
    from ..placement.environment import CACHE_VARS, private_cache_root

    plan.addresses = ["127.0.0.1"] * plan.num_nodes
    plan.hosts = ["localhost"] * plan.num_nodes
    for root in {Path(v).parent for p in plan.processes for k in CACHE_VARS if (v := p.env.get(k))}:
        if root.name.startswith("srl-cache-"):
            try:
                private_cache_root(root)
            except OSError as e:
                raise ConfigError(str(e)) from None


def _export_admin_token(run: RunDir, plan: Plan, *, publish: bool) -> str | None:
    """Put the engines' admin token (inference/guard.py), fresh per run, in this process's environment, where every
    child (engines, orchestrator, restarted ones too) inherits it; ``publish`` also keeps it in
    ``<run>/launcher/admin_token`` (0600). Returns the previous value for ``restore_admin_token``."""
    saved = os.environ.get(ADMIN_TOKEN_ENV)
    if any(p.role == "inference" for p in plan.processes):
        os.environ[ADMIN_TOKEN_ENV] = for_local_deployment(run, publish=publish)
    return saved


def _start_all(sup: Supervisor, plan: Plan, model_path: str, logs: Path, extra_env: dict[str, str]) -> None:
    """Start every process of ``plan`` on this machine with this interpreter's programs, engines and trainer on
    their own cores (the same split as on a Slurm node; see placement/cpus.py)."""
    from ..placement.cpus import cpu_thread_env
    from ..placement.plan import fill

    clear_ready(sup.run)  # an earlier attempt's URLs may point at dead engines
    for spec in plan.processes:
        env = {**os.environ, **cpu_thread_env(plan, spec.name, spec.node_index), **extra_env}
        env.update({k: fill(v, plan, spec.node_index, model_path) for k, v in spec.env.items()})
        argv = [fill(a, plan, spec.node_index, model_path) for a in spec.command]
        if argv:
            argv = [*_PROGRAMS.get(argv[0], argv[:1]), *argv[1:]]
        health = fill(spec.healthcheck_url, plan, spec.node_index) if spec.healthcheck_url else None
        sup.start(spec.name, spec.role, argv, env, logs / spec.log_name, health_url=health)


@dataclass
class Served:
    """A deployment started by :func:`serve_local`: its readiness record (``base_url``, ``engine_urls``,
    ``router_url``, ``roles``, ``model``; see ``toolkit.placement.runtime.ready_info``), the engines' admin token,
    and the supervisor whose children are its processes."""

    ready: dict[str, Any]
    admin_token: str
    sup: Supervisor

    @property
    def base_url(self) -> str:
        """What clients call (the router, else the only engine), without ``/v1``."""
        return self.ready["base_url"]


@contextmanager
def serve_local(
    cfg: RLConfig,
    run: RunDir,
    *,
    logs: Path,
    site: SiteConfig | None = None,
    publish_token: bool = False,
    say: Any = None,
) -> Iterator[Served]:
    """Serve ``cfg``'s inference deployment (engines, and a router when it has several engines or P/D) on this
    machine through the supervisor, as ``srl inference`` does: yields once every engine answers /health (the ready
    file is written), then stops every process (and their workers) and removes the ready file.

    ``logs``: the processes' log directory (``<process>.log``); ``site``: the site whose port range the plan uses
    (default ``cfg.site``); ``publish_token``: keep the admin token in ``<run>/launcher/admin_token`` for other
    runs. Raises ComponentFailed (a process exited during start-up; names its log) or TimeoutError (not healthy
    within ``inference.startup_timeout_s``; names the logs).
    """
    from ..models import resolve_model
    from ..placement.plan import INFERENCE_ROLES, launch_plan
    from ..placement.runtime import ready_info
    from ..preflight.site import load_site

    plan = launch_plan(cfg, site or load_site(cfg.site), run, roles=INFERENCE_ROLES, probe=True)
    _on_this_machine(plan)
    logs.mkdir(parents=True, exist_ok=True)
    sup = Supervisor(cfg, run, plan, say=say or _say, own_groups=True)
    saved = _export_admin_token(run, plan, publish=publish_token)
    try:
        _start_all(sup, plan, str(resolve_model(cfg.model.name)), logs, {})
        sup.wait_ready(interrupt=lambda: False)
        yield Served(ready_info(plan, cfg.model.name), os.environ[ADMIN_TOKEN_ENV], sup)
    finally:
        sup.stop_all()
        clear_ready(run)
        restore_admin_token(saved)
