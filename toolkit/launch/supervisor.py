"""The one supervisor of a run's processes: local children (``srl rl`` on this machine) or ``srun`` job steps (inside
the Slurm batch job). Both start the plan's processes, wait for the engines, restart a dead engine and health-check
it, stop everything when a process ends, and hold the run's lease.

Inside a Slurm batch job the rendered script only sets up the environment and runs::

    exec "$SRL_PYTHON" -m toolkit.launch.supervisor --run-dir RUN --attempt N [--kind KIND] [--secret VAR]...

``--run-dir``: the run directory (``placement.json``, the resolved config ``configs/attempt_<N>/resolved/rl.toml``,
``launcher/site.toml``); ``--attempt``: the config attempt whose config the job runs (default: the newest);
``--kind``: ``rl`` (default), ``inference`` (an inference-only deployment: its admin token is kept in
``launcher/admin_token`` for the runs that use it) or ``eval`` (the first-run gate: its one process's status is the
job's, so ``afterok`` dependents start only after a passed gate); ``--secret VAR`` (repeated: variables the job
needs, warned about when unset). JIT caches on node-local scratch come with each process's environment in the plan
(:func:`toolkit.placement.environment.srl_defaults`). The job then, in order: takes the run's lease (another live
supervisor of the run ends the job with status 1, nothing launched; a requeued job takes over its own), resolves
this allocation's hosts into the plan (:func:`toolkit.placement.runtime.resolve`), runs the pre-run command file
once per node, waits for an external inference deployment, starts each process as an ``srun`` job step (its child),
waits until every engine answers /health and publishes the addresses, and supervises:

- an engine step that dies is restarted (``inference.max_restarts`` within ``inference.restart_window_s``) and must
  answer /health again within ``inference.startup_timeout_s``, exactly as in a local run;
- the first other step that ends ends the job: the stop request is written, the trainer and orchestrator get
  ``slurm.checkpoint_grace_s`` to checkpoint and exit, then the rest is stopped (SIGTERM, SIGINT for an engine, to
  each step's tasks through Slurm, not srun, so an engine that shuts down cleanly leaves no error in the job's log;
  srun's kill after 15 s: :meth:`Supervisor.stop_all`); an orchestrator that finished cleanly waits for the
  trainer's last steps, and a trainer that finished cleanly leaves the orchestrator its final eval of the last
  weights for as long as the orchestrator makes progress, ending the run ``slurm.checkpoint_grace_s`` after the
  later of the trainer's exit and the orchestrator's last progress; a multi-node trainer whose
  torchrun rendezvous did not complete (``deployment.trainer_rendezvous_timeout_s``) ends it with a reason naming
  the trainer nodes that never joined (:mod:`toolkit.launch.rendezvous`);
- the pre-timeout signal (``slurm.signal``): stop request, wait (bounded) for a new COMPLETE checkpoint,
  ``scontrol requeue``, stop the steps;
- SIGTERM/SIGINT (scancel, or the time limit): stop request, stop the steps;
- a step that makes no progress: see the progress watchdog below.

Progress watchdog (:mod:`toolkit.launch.watchdog`, both modes, once the engines are ready): each trainer rank and
the orchestrator keep a progress record (:mod:`toolkit.run.heartbeat`); one that makes no progress for
``monitors.stall_timeout_s`` (start-up phases and evals ``x monitors.stall_startup_factor``, weight phases
``+ monitors.stall_s_per_gib`` per GiB moved) is asked for its Python stacks (SIGURG, answered by ``faulthandler``
into its own log; a stopped process cannot answer, and its ``/proc`` state ``T`` is recorded instead), described in
``logs/attempt_<n>/watchdog.log``, killed, and the run ends with status 7 naming it; the role that merely waits on
it is not blamed, nor is an orchestrator while one of its engines is dead, restarting or silent on /health (its
requests hang; its clock starts again once every engine answers). An engine that does not answer /health for
``monitors.stall_timeout_s`` is killed and restarted as a dead one (or ends the run the same way when
``inference.max_restarts = 0``). In a batch job with
``slurm.requeue``, a stall first requeues the job (every role restarts from the newest complete checkpoint) up to
``monitors.stall_restarts`` times per job, each recorded in ``launcher/stall_restarts.jsonl``.

Every wait in srl and what bounds it:

- supervisor: engines' first /health (``inference.startup_timeout_s``); an external deployment's ready file
  (``inference.startup_timeout_s``); the pre-run command (``monitors.stall_timeout_s``); a restarted engine's
  /health (``inference.startup_timeout_s``); each /health check (5 s); the trainer and orchestrator after a stop
  request or a pre-timeout signal (``slurm.checkpoint_grace_s``), then SIGTERM to SIGKILL (15 s; a step's srun: 15 s
  more to exit after its own SIGTERM); the trainer after the orchestrator finished cleanly, and the orchestrator
  while the trainer works (the watchdog: ``monitors.stall_timeout_s`` without progress); a finished trainer's
  orchestrator (``slurm.checkpoint_grace_s`` after the trainer's exit or its own last progress, whichever is later);
  ``scontrol``/``sbatch`` calls (30 s, 120 s to submit);
  ``squeue``/``scancel`` to signal the steps (10 s each); a look at another node's stuck processes (60 s); py-spy
  (30 s); the lease's renewal thread at exit (its renewal period);
- trainer: a batch (``trainer.batch_timeout_s``, and the watchdog); torchrun's rendezvous
  (``deployment.trainer_rendezvous_timeout_s``); collectives (the process group's timeout, and the watchdog);
  the W&B mirror's final lines (120 s);
- orchestrator: the inference ready file (``inference.startup_timeout_s`` + 60 s); a newer policy (the watchdog,
  blaming the trainer it waits on); each request (``inference.router.request_timeout_s``); each admin call to an
  engine (its client's timeout); each env stage (``orchestrator.*.timeout``); an env worker's start (600 s);
- roles and supervisors: a lost lease or a dead supervisor ends them (:mod:`toolkit.lease`).

Exit status of the job: how the run ended, decided, recorded and printed last by :mod:`toolkit.run.ending` (0 when
the trainer reached max_steps or the job was requeued; see its table), or 1 when nothing could be launched.
Every line it logs reads ``<date> <time> srl[<job id>]: ...`` (``analysis.diagnose`` reads them).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from .. import lease as leases
from ..fsutil import append_jsonl, atomic_write_text, write_marker
from ..placement.cpus import affinity_of, apply_affinity
from ..placement.runtime import is_multinode_torchrun
from ..procutil import GroupReaper, kill_with_parent_preexec
from ..run import heartbeat
from ..run.layout import RunDir
from . import rendezvous, watchdog
from .replicas import cancel_replicas

if TYPE_CHECKING:
    from toolkit.config.model import RLConfig
    from toolkit.config.site import SiteConfig
    from toolkit.placement.plan import Plan


ATTEMPT_ENV = "SRL_ATTEMPT"
"""The config attempt a Slurm batch job runs (its ``--attempt``), in every job step's environment."""
# Roles whose clean exit means the run is done; inference, router and a served teacher serve until told to stop.
# The first-run gate's one process (a job of ``srl eval``) ends its job with its own status.
FINITE_ROLES = ("trainer", "orchestrator", "gate")
# Roles restarted when they die. An engine holds no state the run cannot rebuild: it serves the newest STABLE
# broadcast (or the base model), which the orchestrator pushes into it again once it answers
# (toolkit.orchestrator.engines), and rollouts in flight on it are retried by the policy client. The trainer and
# the orchestrator are the run's state (a crash ends the run; --resume continues from the newest checkpoint); a
# router death usually means a configuration or port problem that a restart would only repeat. A served teacher
# (role "teacher") is not restarted: its death ends the run naming it, as training on unscored rollouts would not do.
RESTARTABLE_ROLES = ("inference",)
# Seconds between supervision polls; small so a crash ends the run promptly.
POLL_S = 0.5
# Seconds a stopped process gets between SIGTERM and SIGKILL.
TERM_GRACE_S = 15.0
# The signal a job step's tasks get to end (scancel's name), by role; SIGTERM for the others. vLLM's server shuts down
# on SIGINT exactly as on SIGTERM, and a SIGINT spares its log the line slurmstepd writes for a SIGTERM sent to a step
# ("error: *** STEP 12.0 ON node1 CANCELLED ... ***"). vllm-router dies of SIGINT (its Python launcher's
# KeyboardInterrupt) but exits 0 on SIGTERM; the trainer and orchestrator stop on SIGTERM as in a local run.
STEP_STOP_SIGNALS = {"inference": "INT", "teacher": "INT"}
# Seconds a job step's srun gets to exit after its own SIGTERM (it SIGKILLs its tasks at once and exits when they are
# gone) before it is SIGKILLed.
SRUN_EXIT_WAIT_S = 15.0
# Seconds between two reads of the progress records (a handful of small files).
PROGRESS_CHECK_S = 1.0
# At most this many seconds between two /health checks of a running engine (less for a short stall bound), and the
# timeout of one check.
HEALTH_CHECK_S = 30.0
HEALTH_TIMEOUT_S = 5.0
# Bound on the batch job's look at a stuck process on another node (srun of a one-line script).
REMOTE_PROBE_TIMEOUT_S = 60.0


def is_restartable(role: str) -> bool:
    """Whether a process of ``role`` is restarted when it dies (only inference engines; see RESTARTABLE_ROLES)."""
    return role in RESTARTABLE_ROLES


@dataclass
class RestartBudget:
    """Counts restarts of one process, like systemd's ``StartLimitBurst``: at most ``max_restarts`` (>= 0) within
    any ``window_s`` seconds (None: in the whole attempt). Times are ``time.monotonic()`` seconds supplied by the
    caller, so the policy is testable without sleeping."""

    max_restarts: int
    window_s: float | None = None
    times: list[float] = field(default_factory=list)

    def _recent(self, now: float) -> list[float]:
        return list(self.times) if self.window_s is None else [t for t in self.times if now - t < self.window_s]

    def used(self, now: float) -> int:
        """Restarts that count against the budget at ``now`` (those within the window)."""
        return len(self._recent(now))

    def try_restart(self, now: float) -> bool:
        """Record a restart at ``now`` and return True when the budget allows one; False (nothing recorded) when
        ``max_restarts`` restarts already happened within the window."""
        self.times = self._recent(now)
        if len(self.times) >= self.max_restarts:
            return False
        self.times.append(now)
        return True


@dataclass
class Child:
    """One supervised process: a plan process on this machine, or the ``srun`` of its job step."""

    name: str
    role: str
    proc: subprocess.Popen
    log: IO[bytes] | None  # the child's output file (local); None for a job step (srun writes its own log)
    log_path: Path
    argv: list[str]  # what was started, reused verbatim by a restart
    env: dict[str, str]
    own_group: bool  # started in a process group of its own (local): signalled and killed as a group
    health_url: str | None = None
    returncode: int | None = None
    budget: RestartBudget | None = None
    restarted_at: float | None = None  # monotonic time of the restart still waiting for /health

    def poll(self) -> int | None:
        """The exit status once the process has ended (a Popen status: negative for a signal), else None."""
        if self.returncode is None:
            self.returncode = self.proc.poll()
        return self.returncode


class ComponentFailed(RuntimeError):
    """A supervised process exited while the run needed it; ``child`` names it."""

    def __init__(self, child: Child):
        self.child = child
        super().__init__(f"{child.name} exited with status {child.returncode} (log: {child.log_path})")


class Supervisor:
    """Starts, watches, restarts and stops the processes of one attempt of a run.

    ``say(text, error=False)`` prints the supervisor's messages (the local launcher's ``srl: ...`` lines, the batch
    job's ``srl[<job>]: ...`` lines). ``signal_handler(signum)`` is called from the signal handlers installed by
    :meth:`handle_signals`. ``own_groups``: start each child in its own process group with a reaper that kills the
    groups should the supervisor die (local); job steps stay in the batch job's group, which Slurm tracks.
    """

    def __init__(
        self,
        cfg: RLConfig,
        run: RunDir,
        plan: Plan,
        *,
        say: Callable[..., None],
        own_groups: bool,
        restart_before_ready: bool = False,
    ):
        self.cfg, self.run, self.plan, self.say = cfg, run, plan, say
        # An engine that dies before every engine first answered: restarted like any later death (a batch job,
        # whose engines may start on a node still busy with a previous job), or the end of the run (a local run:
        # an engine that cannot start at all is a configuration problem a restart would only repeat).
        self.restart_before_ready = restart_before_ready
        self.children: list[Child] = []
        self.reaper = GroupReaper() if own_groups else None
        self.lost: str | None = None  # why the lease was lost (set from the lease's heartbeat thread)
        self.signalled: int | None = None  # the first signal received
        self.stop_at: float | None = None  # monotonic time of the first stop request
        self.ready = False  # every engine answered /health once: from then on there is work to checkpoint
        self._clean_exit_at: dict[str, float] = {}  # monotonic time a finite role was first seen exited with 0
        # The progress watchdog (toolkit.launch.watchdog): what stalled, once something did.
        bounds = watchdog.Bounds.from_config(cfg.monitors)
        self.progress = watchdog.ProgressWatch(bounds)
        self.health = watchdog.HealthWatch(bounds.timeout_s)
        self.stall: watchdog.Stall | None = None
        self._next_progress_check = 0.0
        self._next_health_check = 0.0
        # Inside a batch job: how to look at (and ask for the stacks of) processes on another node.
        self.remote_probe: Callable[[str, list[int]], dict[int, str | None]] | None = None
        # Inside a batch job: how to signal the tasks of job steps to end without their srun (see stop_all); returns
        # the steps it could not reach.
        self.term_steps: Callable[[list[Child]], list[Child]] | None = None
        heartbeat.clear(run)  # the previous attempt's records describe processes that are gone

    # -- starting --------------------------------------------------------------------------------------------
    def start(
        self, name: str, role: str, argv: list[str], env: dict[str, str], log_path: Path, health_url: str | None = None
    ) -> Child:
        """Start one process (``argv`` with environment ``env``), output appended to ``log_path`` for a local
        child; returns it. Call from the main thread: the parent-death signal follows the thread that started it."""
        log = None
        if self.reaper is not None:
            log = open(log_path, "ab")  # noqa: SIM115 - held open for the child's lifetime
            log.write(f"# srl: starting {name}: {' '.join(argv)}\n".encode())
            log.flush()
        child = Child(
            name,
            role,
            self._spawn(argv, env, log),
            log,
            log_path,
            argv,
            env,
            self.reaper is not None,
            health_url=health_url,
        )
        self.children.append(child)
        return child

    def _spawn(self, argv: list[str], env: dict[str, str], log: IO[bytes] | None) -> subprocess.Popen:
        # The child gets SIGKILL from the kernel when the supervisor dies (its parent-death signal); a local child
        # also gets its own process group, which the reaper learns, so its own children die with the supervisor
        # too; an engine is pinned to its cores. preexec_fn while other threads may run is safe here: it only makes
        # system calls (prctl through a ctypes handle and the CPU list, both prepared in the parent, and
        # sched_setaffinity); it imports nothing and takes no lock.
        own = self.reaper is not None
        die_with_parent = kill_with_parent_preexec()
        cpus = affinity_of(env)  # an engine on its own cores (placement/cpus.py); parsed here, before the fork

        def preexec() -> None:
            if die_with_parent is not None:
                die_with_parent()
            apply_affinity(cpus)

        proc = subprocess.Popen(
            argv,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT if own else None,
            stdin=subprocess.DEVNULL,
            start_new_session=own,
            preexec_fn=preexec,  # noqa: PLW1509
        )
        if self.reaper is not None:
            self.reaper.add(proc.pid)  # a new session's group id is its leader's PID
        return proc

    # -- signals and the lease -------------------------------------------------------------------------------
    def handle_signals(self, signals: tuple[int, ...], on_signal: Callable[[int], None] | None = None) -> dict:
        """Record the first of ``signals`` (``self.signalled``, ``self.stop_at``) and call ``on_signal`` with it;
        returns the previous handlers for :meth:`restore_signals`."""

        def _handler(signum: int, _frame: Any) -> None:
            if self.signalled is None and self.lost is None:
                self.signalled, self.stop_at = signum, time.monotonic()
                if on_signal is not None:
                    on_signal(signum)

        return {s: signal.signal(s, _handler) for s in signals}

    @staticmethod
    def restore_signals(old: dict) -> None:
        for s, h in old.items():
            signal.signal(s, h)

    def watch_lease(self, lease: leases.Lease) -> None:
        """End the run when ``lease`` passes to another supervisor (see :meth:`check_lease`)."""
        lease.on_lost(lambda why: setattr(self, "lost", why))

    def check_lease(self) -> None:
        """Raise LeaseLost once the lease was lost."""
        if self.lost is not None:
            raise LeaseLost(f"the run lease was lost ({self.lost})")

    def request_stop(self) -> None:
        """Write the run's stop request: the trainer checkpoints and every role exits."""
        self.run.control.mkdir(parents=True, exist_ok=True)
        write_marker(self.run.stop_request)

    # -- readiness and restarts ------------------------------------------------------------------------------
    def wait_ready(self, *, interrupt: Callable[[], bool]) -> bool:
        """Block until every engine (the router, a served teacher) answers /health, then publish the addresses for the
        orchestrator and other runs (``control/inference_ready.json``). Returns True once ready (or when the plan
        has no engines), False when ``interrupt()`` turned true first.

        Every child is watched meanwhile: a trainer or orchestrator that dies during the (slow) engine start-up
        ends the run at once. Raises ComponentFailed, LeaseLost, or TimeoutError after
        ``inference.startup_timeout_s``.
        """
        from ..engines.health import is_healthy, write_ready
        from ..placement.runtime import ready_info

        pending = {
            c.name: c.health_url.removesuffix("/health")
            for c in self.children
            if c.role in ("inference", "router", "teacher") and c.health_url
        }
        n = len(pending)
        timeout = self.cfg.inference.startup_timeout_s
        deadline = time.monotonic() + timeout
        while pending:
            if self.restart_before_ready and (ended := self.watch_restarts()) is not None:
                raise ComponentFailed(ended)
            for c in self.children:
                if c.poll() is not None and (c.returncode != 0 or c.role not in FINITE_ROLES):
                    raise ComponentFailed(c)
            self.check_lease()
            if interrupt():
                return False
            for name, url in list(pending.items()):
                if is_healthy(url):
                    del pending[name]
            if time.monotonic() > deadline:
                logs = sorted(str(c.log_path) for c in self.children if c.name in pending)
                raise TimeoutError(
                    f"inference not healthy after {timeout:.0f} s: {sorted(pending.values())} (see {', '.join(logs)})"
                )
            time.sleep(POLL_S)
        if n:  # nothing to publish for a plan without engines (a trainer-only plan, or inference.external)
            write_ready(self.run, ready_info(self.plan, self.cfg.model.name))
            self.say(f"inference ready ({n} endpoint(s))")
        self.ready = True
        return True

    def _restart(self, c: Child) -> bool:
        """Restart the dead engine ``c`` in place when its budget allows (returns True); False when used up."""
        inf = self.cfg.inference
        now = time.monotonic()
        if c.budget is None:
            c.budget = RestartBudget(inf.max_restarts, inf.restart_window_s)
        if not c.budget.try_restart(now):
            return False
        window = f" within {inf.restart_window_s:.0f} s" if inf.restart_window_s is not None else ""
        self.say(
            f"{c.name} exited with status {c.returncode}; restarting it (restart {c.budget.used(now)} of "
            f"{inf.max_restarts}{window}; log: {c.log_path})",
            error=True,
        )
        # The dead leader's workers (vLLM's engine-core process) would keep memory, cores and maybe the port.
        self._signal(c, signal.SIGKILL)
        c.proc.wait()
        if self.reaper is not None:
            self.reaper.discard(c.proc.pid)
        if c.log is not None:
            c.log.write(f"# srl: restarting {c.name} after exit status {c.returncode}\n".encode())
            c.log.flush()
        c.proc = self._spawn(c.argv, c.env, c.log)
        c.returncode, c.restarted_at = None, now
        return True

    def watch_restarts(self) -> Child | None:
        """Restart engines that died; report restarted ones that answer /health again. Returns a child that ends
        the run (restart budget used, or not healthy within ``inference.startup_timeout_s``), else None."""
        from ..engines.health import is_healthy

        inf = self.cfg.inference
        for c in self.children:
            if not is_restartable(c.role) or inf.max_restarts == 0:
                continue
            if c.poll() is not None:
                if not self._restart(c):
                    self.say(
                        f"{c.name} exited with status {c.returncode}; restart budget used "
                        f"({inf.max_restarts} restart(s)); stopping the run",
                        error=True,
                    )
                    return c
            elif c.restarted_at is not None and c.health_url:
                took = time.monotonic() - c.restarted_at
                if is_healthy(c.health_url.removesuffix("/health"), timeout_s=1.0):
                    c.restarted_at = None
                    self.say(
                        f"{c.name} healthy again {took:.1f} s after its restart; the orchestrator loads the "
                        "newest STABLE weights into it before it serves rollouts"
                    )
                elif took > inf.startup_timeout_s:
                    self.say(f"restarted {c.name} not healthy after {took:.0f} s; stopping the run", error=True)
                    c.returncode = c.returncode or 1
                    return c
        return self.check_engines()

    def check_engines(self, now: float | None = None) -> Child | None:
        """The watchdog's look at the running engines (every :data:`HEALTH_CHECK_S` seconds at most, once all were
        ready): an engine that has not answered /health for ``monitors.stall_timeout_s`` is killed, after its
        state is logged, so that it is restarted as a dead engine is. Returns it when it cannot be restarted
        (``inference.max_restarts = 0``): the run then ends as stalled, naming it. None otherwise."""
        from ..engines.health import is_healthy

        now = time.monotonic() if now is None else now
        if not self.ready or now < self._next_health_check:
            return None
        self._next_health_check = now + min(HEALTH_CHECK_S, self.health.timeout_s / 4)
        for c in self.children:
            if c.role != "inference" or not c.health_url or c.poll() is not None:
                continue
            if c.restarted_at is not None:  # still starting again: inference.startup_timeout_s bounds it
                self.health.reset(c.name, now)
                continue
            ok = is_healthy(
                c.health_url.removesuffix("/health"), timeout_s=min(HEALTH_TIMEOUT_S, self.health.timeout_s)
            )
            now = time.monotonic()
            self.health.observe(c.name, ok, now)
            if c.name not in self.health.overdue(now):
                continue
            silent = self.health.silent_for(c.name, now)
            state = watchdog.describe_state(watchdog.proc_state(c.proc.pid)) if self.reaper else "on its node"
            again = is_restartable(c.role) and self.cfg.inference.max_restarts > 0
            self.say(
                f"watchdog: {c.name} did not answer /health for {silent:.0f} s (monitors.stall_timeout_s; "
                f"process {c.proc.pid}: {state}); killing it{' to restart it' if again else ''}",
                error=True,
            )
            self._report([f"{c.name} did not answer /health for {silent:.0f} s", *self._py_spy([c.proc.pid])])
            self._signal(c, signal.SIGKILL)
            self._reap_killed(c)
            self.health.reset(c.name, now)
            if not again:
                self.stall = watchdog.Stall(
                    c.name, c.role, {"phase": "serving (no /health answer)"}, silent, self.health.timeout_s, hung=True
                )
                return c
        return None

    def check_progress(self, now: float | None = None) -> Child | None:
        """The watchdog's look at the trainer's and orchestrator's progress records (every
        :data:`PROGRESS_CHECK_S` seconds). When one stalled (:class:`toolkit.launch.watchdog.ProgressWatch`): log
        why, ask the stuck processes for their Python stacks (into their own logs; a stopped one cannot answer: its
        state is logged), kill them, remember the stall (:attr:`stall`) and return the stuck role's process, which
        ends the run. None while everything progresses."""
        now = time.monotonic() if now is None else now
        if now < self._next_progress_check:
            return None
        self._next_progress_check = now + PROGRESS_CHECK_S
        live = self.alive()
        running = {c.role for c in self.children if c.poll() is None}  # a record may wait on an engine too
        stalls = self.progress.observe(heartbeat.read_all(self.run), running, now)
        if any(x.role == "orchestrator" and not x.hung for x in stalls) and self._an_engine_is_out():
            # Its requests to an engine that does not answer (stopped, dead, restarting) hang without closing its
            # serving gate; the engine watch bounds that engine. The orchestrator's clock starts again once every
            # engine answers.
            self.progress.excuse("orchestrator", now)
            stalls = [x for x in stalls if x.role != "orchestrator"]
        if not stalls:
            return None
        self.stall = first = stalls[0]
        self.say(
            f"watchdog: {first.message()}; writing the stuck processes' stacks to their logs and stopping the run",
            error=True,
        )
        lines = [f"stall: {first.message()}"]
        stuck = [c for c in live if c.role in {x.role for x in stalls}]
        for x in stalls:
            lines += self._evidence(x, next((c for c in stuck if c.role == x.role), None))
        self._report(lines)
        for line in lines[1:]:
            self.say(f"watchdog: {line}", error=True)
        for c in stuck:
            self._signal(c, signal.SIGKILL)
            self._reap_killed(c)
        return next((c for c in stuck if c.role == first.role), stuck[0] if stuck else None)

    def _an_engine_is_out(self) -> bool:
        """Whether one of this run's engines is dead, restarting, or does not answer /health now."""
        from ..engines.health import is_healthy

        for c in self.children:
            if c.role != "inference" or not c.health_url:
                continue
            if c.poll() is not None or c.restarted_at is not None:
                return True
            if not is_healthy(c.health_url.removesuffix("/health"), timeout_s=HEALTH_TIMEOUT_S):
                return True
        return False

    def _reap_killed(self, c: Child) -> None:
        """Wait for a child the watchdog just sent SIGKILL, at most :data:`TERM_GRACE_S` seconds: a process in
        uninterruptible sleep (a hung filesystem or driver, what a watchdog exists for) ignores SIGKILL until the
        kernel call returns, and the supervisor must not hang on it; its state is logged and the run goes on
        ending."""
        try:
            c.proc.wait(timeout=TERM_GRACE_S)
        except subprocess.TimeoutExpired:
            state = watchdog.describe_state(watchdog.proc_state(c.proc.pid)) if self.reaper else "on its node"
            self.say(
                f"watchdog: {c.name} (process {c.proc.pid}) still there {TERM_GRACE_S:g} s after SIGKILL "
                f"({state}); not waiting for it",
                error=True,
            )
        c.poll()

    def _evidence(self, x: watchdog.Stall, child: Child | None) -> list[str]:
        """Ask the processes of stall ``x`` for their stacks and describe each one (lines for the report)."""
        rec = x.record or {}
        pids = x.pids() or ([child.proc.pid] if child is not None and self.reaper is not None else [])
        host = rec.get("host")
        if not pids:
            return [f"{x.key}: no process id known (job step {child.name if child else '?'}); no stacks"]
        if host in (None, socket.gethostname()):
            states = watchdog.request_stacks(pids)
        elif self.remote_probe is not None:
            states = self.remote_probe(str(host), pids)
        else:
            return [f"{x.key}: processes {pids} run on {host}, which this supervisor cannot reach; no stacks"]
        if any(st not in (None, "T", "t", "Z") for st in states.values()):
            time.sleep(watchdog.DUMP_WAIT_S)  # faulthandler writes from its signal handler: let it finish
        log = child.log_path if child is not None else "its log"
        out = [
            f"{x.key} pid {pid} on {host or 'this machine'}: {watchdog.describe_state(st)}"
            + (f" ({log})" if st not in (None, "T", "t", "Z") else "")
            for pid, st in states.items()
        ]
        if host in (None, socket.gethostname()):
            out += self._py_spy([p for p, st in states.items() if st not in (None, "T", "t", "Z")])
        return out

    @staticmethod
    def _py_spy(pids: list[int]) -> list[str]:
        """``py-spy dump`` of each of ``pids`` when py-spy is installed (optional), as report lines."""
        out = []
        for pid in pids:
            text = watchdog.py_spy_dump(pid)
            if text:
                out.append(f"py-spy dump of pid {pid}:\n{text}")
        return out

    def _report(self, lines: list[str]) -> None:
        """Append ``lines`` to the attempt's ``watchdog.log`` next to the roles' logs (never raises)."""
        logs = {c.log_path.parent for c in self.children}
        if not logs:
            return
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        try:
            with open(min(logs) / "watchdog.log", "a", encoding="utf-8") as f:
                f.writelines(f"{stamp} {line}\n" for line in lines)
        except OSError as e:
            self.say(f"watchdog: cannot write its report: {e}", error=True)

    def first_ending(self) -> Child | None:
        """The process whose exit ends the run, if any: any that exited, except an engine while restarts are on and
        no stop was requested (:meth:`watch_restarts` owns those) and a trainer or orchestrator that finished
        cleanly while the other still works. An orchestrator that wrote its last batch leaves the trainer
        to train on it, however long that takes; a trainer that wrote its final weights leaves the orchestrator its
        eval of them until ``slurm.checkpoint_grace_s`` has passed both since the trainer's exit and since the
        orchestrator's last progress (each eval group is progress, as seen by :meth:`check_progress`): a fixed grace
        from the trainer's exit cut a 400-task multi-turn final eval off, while an orchestrator that does nothing
        (hung, or one that keeps no progress record) still cannot hold the allocation."""
        finite_alive = bool(self.alive())
        now = time.monotonic()
        restarts = self.cfg.inference.max_restarts > 0 and not self.run.stop_request.exists()
        for c in self.children:
            if c.poll() is None:
                continue
            if restarts and is_restartable(c.role):
                # An engine that died after watch_restarts looked at it this poll (its /health checks take a while):
                # restarted on the next poll, or the run ends there once its restart budget is used.
                continue
            if c.role in FINITE_ROLES and c.returncode == 0 and finite_alive:
                since = max(self._clean_exit_at.setdefault(c.name, now), self.progress.last_progress())
                if c.role == "orchestrator" or now - since < self.cfg.slurm.checkpoint_grace_s:
                    continue
            return c
        return None

    def watch(self, on_poll: Callable[[], None] | None = None) -> Child | None:
        """Supervise the started processes until one ends the run (:meth:`first_ending`; returned) or a signal
        came (None; see :meth:`handle_signals`). Dead engines are restarted meanwhile, except once a role asked the
        run to stop: then an engine's exit ends it. ``on_poll`` runs every poll (the local progress line). Raises
        LeaseLost."""
        while self.signalled is None:
            self.check_lease()
            if on_poll is not None:
                on_poll()
            first = (
                (None if self.run.stop_request.exists() else self.watch_restarts())
                or self.first_ending()
                or self.check_progress()
            )
            if first is not None:
                return first
            time.sleep(POLL_S)
        return None

    def end(self, first: Child | None, *, reason: str | None = None) -> Any:
        """Stop the run after ``first`` ended it (None: it ended before every engine answered; ``reason`` says
        why): decide and record how it ended (:mod:`toolkit.run.ending`; before the stop request and kills below,
        which would read as failures), write the stop request, then :meth:`stop_after`. ``first`` failed when its
        status is non-zero or it serves (an engine or router has no clean exit while the run needs it). Returns the
        ending."""
        from ..run import ending

        failed = first is None or first.returncode != 0 or first.role not in FINITE_ROLES
        why = reason or (f"exit status {exit_status(first.returncode)} (log: {first.log_path})" if first else "")
        if self.stall is not None:  # the watchdog's kill is not the failure: the hang before it is
            end = ending.settle(self.run, stalled=self.stall.role, stalled_reason=self.stall.message())
        else:
            end = ending.settle(
                self.run, failed=(first.name if first else "inference") if failed else None, failed_reason=why
            )
        self.request_stop()
        self.stop_after()
        return end

    def stop_after(self) -> None:
        """Give the trainer and orchestrator up to ``slurm.checkpoint_grace_s`` seconds to exit (after a stop
        request: they checkpoint first), then stop every process (:meth:`stop_all`). No wait before the engines
        were ready: nothing was generated or trained, and roles still importing torch would only delay the stop."""
        _wait(lambda: not self.alive(), self.cfg.slurm.checkpoint_grace_s if self.ready else 0.0)
        self.stop_all()

    # -- stopping --------------------------------------------------------------------------------------------
    def alive(self, roles: tuple[str, ...] = FINITE_ROLES) -> list[Child]:
        """Children of ``roles`` still running."""
        return [c for c in self.children if c.role in roles and c.poll() is None]

    def stop_all(self, term_wait_s: float = TERM_GRACE_S) -> None:
        """SIGTERM every live child, SIGKILL what is left after ``term_wait_s`` seconds, and close the reaper.

        A local child's SIGTERM goes to its process group. A job step's goes to its tasks through
        :attr:`term_steps` (Slurm, on every node of the step; SIGINT for an engine: :data:`STEP_STOP_SIGNALS`),
        never to its srun: srun answers SIGTERM by SIGKILLing the tasks and reporting each as an error ("task 0:
        Killed"), even an engine that would have shut down cleanly. A step still running after ``term_wait_s`` (or
        one ``term_steps`` could not reach, or every step when ``term_wait_s`` is 0 or there is no ``term_steps``)
        gets srun's SIGTERM, then its srun SIGKILL :data:`SRUN_EXIT_WAIT_S` seconds later."""
        live = [c for c in self.children if c.proc.poll() is None]
        steps = [c for c in live if not c.own_group]
        through_srun = steps
        if steps and term_wait_s > 0 and self.term_steps is not None:
            through_srun = self.term_steps(steps)
        for c in live:
            if c.own_group or c in through_srun:
                self._signal(c, signal.SIGTERM)
        self._wait_children(self.children, term_wait_s)
        late = [c for c in steps if c not in through_srun and c.proc.poll() is None]
        if late:
            self.say(
                f"{', '.join(c.name for c in late)} still running {term_wait_s:g} s after the signal to end; "
                "killing (srun's SIGTERM)",
                error=True,
            )
            for c in late:
                self._signal(c, signal.SIGTERM)
            self._wait_children(late, SRUN_EXIT_WAIT_S)
        for c in self.children:
            # Kill a local child's whole group even when the leader exited: engines fork workers that would
            # otherwise linger.
            self._signal(c, signal.SIGKILL)
            c.proc.wait()
            c.poll()
            if self.reaper is not None:
                self.reaper.discard(c.proc.pid)
            if c.log is not None:
                c.log.close()
        if self.reaper is not None:
            self.reaper.close()

    @staticmethod
    def _wait_children(children: list[Child], wait_s: float) -> None:
        """Wait up to ``wait_s`` seconds in all (at least 0.1 s each) for ``children`` to exit."""
        deadline = time.monotonic() + wait_s
        for c in children:
            try:
                c.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass

    @staticmethod
    def _signal(c: Child, sig: int) -> None:
        try:
            if c.own_group:
                os.killpg(c.proc.pid, sig)
            elif c.proc.poll() is None:
                c.proc.send_signal(sig)
        except (ProcessLookupError, PermissionError):
            pass


class LeaseLost(RuntimeError):
    """The run's lease was taken over by another supervisor while this one ran."""


# ---- inside the Slurm batch job --------------------------------------------------------------------------------


def _job_log(msg: str, *, error: bool = False) -> None:  # error: accepted like the local say(); one batch log
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    print(f"{stamp} srl[{os.environ.get('SLURM_JOB_ID', '?')}]: {msg}", file=sys.stderr, flush=True)


def job_environment(run: RunDir, *, kind: str, secrets: list[str], env: dict[str, str]) -> dict[str, str]:
    """What the batch job adds to its steps' environment, given the job's own ``env``: the engines' admin token
    (fresh per attempt; an inference-only deployment keeps it in ``launcher/admin_token``, 0600, for the runs that
    use it). Warns about each of ``secrets`` (variable names) missing from ``env``; secret values reach the steps by
    inheritance only and are never written."""
    from ..engines.admin_token import ADMIN_TOKEN_ENV, for_local_deployment

    for name in sorted(set(secrets)):
        if not env.get(name):
            _job_log(f"warning: {name} is not set in the job's environment")
    return {ADMIN_TOKEN_ENV: for_local_deployment(run, publish=kind == "inference")}


def step_log(spec: Any, logs: Path) -> Path:
    """The log file of plan process ``spec``'s job step (``%t``, the node rank, for a step on several nodes)."""
    return logs / (spec.log_name if spec.num_nodes == 1 else spec.log_name.replace(".log", "-%t.log"))


def step_cpus(het_group: int, is_het: bool, env: Mapping[str, str] | None = None) -> str | None:
    """The cores per task the job holds for node group ``het_group`` (sbatch's ``SLURM_CPUS_PER_TASK``, per
    component ``SLURM_CPUS_PER_TASK_HET_GROUP_<n>`` in a het job), for a job step to name again: srun of Slurm
    22.05-23.02 does not take the job's ``--cpus-per-task``, and a task bound to the one CPU it then asks for would
    run an engine or a trainer on one core. None when the job asked none (the site's ``[cpus]`` unset): the step then
    asks nothing either and may use every core its job holds on its nodes (srun without ``--exact``)."""
    env = os.environ if env is None else env
    value = env.get(f"SLURM_CPUS_PER_TASK_HET_GROUP_{het_group}" if is_het else "SLURM_CPUS_PER_TASK", "")
    return value if value.isdigit() and int(value) > 0 else None


def step_argv(plan: Plan, spec: Any, run: RunDir, log: Path, *, python: str, container: list[str]) -> list[str]:
    """The ``srun`` command of plan process ``spec``'s job step, named after the process: one task per node from
    its first node, output appended to ``log``; the step execs the process through
    :mod:`toolkit.placement.runtime`."""
    # --overlap: steps share nodes without waiting on each other ("step creation temporarily disabled").
    # --job-name: the step's name, by which the job finds the step to signal its tasks (_term_steps).
    first = plan.groups[spec.het_group].first_node
    het = [f"--het-group={spec.het_group}"] if plan.is_het else []
    cpus = step_cpus(spec.het_group, plan.is_het)
    return [
        "srun",
        f"--job-name={spec.name}",
        "--overlap",
        "--kill-on-bad-exit=1",
        "--open-mode=append",
        f"--output={log}",
        f"--error={log}",
        *het,
        f"--nodes={spec.num_nodes}",
        f"--ntasks={spec.num_nodes}",
        "--ntasks-per-node=1",
        *([f"--cpus-per-task={cpus}"] if cpus else []),
        f"--relative={spec.node_index - first}",
        *container,
        python,
        "-m",
        "toolkit.placement.runtime",
        "exec",
        "--run-dir",
        str(run.root),
        "--process",
        spec.name,
    ]


def settle_job(run: RunDir, *, signalled: str | None = None, requeued: bool = False, lost: bool = False) -> int:
    """Decide, record and print how the job's run ended after a signal (``TERM``, ``INT``...), a requeue or a lost
    lease (:mod:`toolkit.run.ending`, which tells a cancel from the time limit); returns the job's exit status."""
    from ..run import ending

    if lost:  # the run is someone else's now: nothing is recorded
        end = ending.settle(run, lease_lost=True)
    else:
        end = ending.settle_after_signal(run, signalled, requeued=requeued)
    print(end.line(), flush=True)
    return end.exit_status


def _wait(check: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)
    return True


def run_job(
    run: RunDir, *, attempt: int | None, kind: str, secrets: list[str] | None = None, env: dict[str, str] | None = None
) -> int:
    """Supervise this Slurm batch job's run (see the module docstring; ``secrets``: see :func:`job_environment`);
    returns the job's exit status."""
    from ..config import ConfigError
    from ..placement.runtime import ResolveError, job_config, resolve, shell_env

    env = dict(os.environ if env is None else env)
    job = env.get("SLURM_JOB_ID", "?")
    _job_log(f"job {job} restart {env.get('SLURM_RESTART_COUNT', '0')} on {env.get('SLURM_JOB_NODELIST', '?')}")
    # This job is the run's one supervisor while it lives; a requeued job takes over the lease it left.
    try:
        lease = leases.acquire(run, command=f"srl {kind} (batch job)")
    except leases.LeaseHeld as e:
        _job_log(f"srl: {e}")
        _job_log("another supervisor holds this run (see above); nothing was launched")
        return 1
    try:
        # Hosts, addresses, ports and the rendezvous host are resolved here, on the host side, in Python (no
        # scontrol inside containers, no localhost fallback). Nothing is launched if this fails.
        try:
            cfg, site = job_config(run, attempt)  # read once for the whole job
            plan = resolve(run, cfg, site, env)
        except (ResolveError, ConfigError, KeyError, OSError) as e:
            _job_log(f"error: {e}")
            _job_log("cannot resolve this allocation's placement; nothing was launched")
            return 1
        atomic_write_text(run.launcher / f"job-{job}.env", shell_env(plan))  # when the job started (srl report)
        for p in plan.processes:
            hosts = ",".join(plan.hosts[i] for i in p.node_indices)
            _job_log(f"{p.name}: nodes {list(p.node_indices)} ({hosts}) gpus {list(p.gpus)} ports {p.ports}")
        _job_log(f"hosts: {','.join(plan.hosts)}")
        extra = job_environment(run, kind=kind, secrets=secrets or [], env=env)
        step_env = {**env, **extra, leases.LEASE_ENV: lease.token}
        if attempt is not None:  # the attempt this job runs, for a process that reads its own (the gate's job)
            step_env[ATTEMPT_ENV] = str(attempt)
        return _supervise_job(cfg, site, run, plan, lease, step_env, attempt=attempt)
    finally:
        lease.release()


def _supervise_job(
    cfg: RLConfig,
    site: SiteConfig,
    run: RunDir,
    plan: Plan,
    lease: leases.Lease,
    env: dict[str, str],
    *,
    attempt: int | None,
) -> int:
    from ..placement.environment import container_prefix
    from ..placement.plan import fill
    from ..placement.runtime import newest_complete_since

    s = cfg.slurm
    python = env.get("SRL_PYTHON") or sys.executable
    container = container_prefix(site, run.root)
    pre_run = run.launcher / "pre_run.sh"
    if s.pre_run_command and pre_run.exists():
        # From a file, once per node: the command's text never appears on a command line.
        het = ["--het-group=0"] if plan.is_het else []
        limit = cfg.monitors.stall_timeout_s
        try:
            rc = subprocess.run(
                ["srun", "--overlap", "--ntasks-per-node=1", *het, "bash", str(pre_run)],
                env=env,
                check=False,
                timeout=limit,
            ).returncode
            if rc:
                _job_log(f"pre-run command failed with status {rc}")
        except subprocess.TimeoutExpired:  # run() has killed its srun: the job goes on as after a failed command
            _job_log(f"pre-run command still running after {limit:g} s (monitors.stall_timeout_s): stopped")
    if plan.external_inference:
        ready = RunDir(Path(plan.external_inference)).inference_ready
        timeout = cfg.inference.startup_timeout_s
        if not _wait(ready.exists, timeout):
            _job_log(f"the external inference deployment never became ready ({ready} missing after {timeout:g} s)")
            return 1
    logs = run.log_attempt(attempt or (run.attempts() or [1])[-1])
    logs.mkdir(parents=True, exist_ok=True)
    sup = Supervisor(cfg, run, plan, say=_job_log, own_groups=False, restart_before_ready=True)
    sup.remote_probe = lambda host, pids: _srun_probe(host, pids, env)
    sup.term_steps = lambda children: _term_steps(children, env)
    sup.watch_lease(lease)
    preempt = getattr(signal, f"SIG{s.signal}") if s.requeue else None
    sup.handle_signals(tuple(x for x in (preempt, signal.SIGTERM, signal.SIGINT) if x is not None))
    first: Child | None = None
    # Where this start of each multi-node torchrun step begins in its node logs: a failed rendezvous is explained
    # from what this start wrote (the logs are appended across requeues).
    rdzv_logs = {
        spec.name: rendezvous.StepLogs.mark(rendezvous.node_logs(logs, spec))
        for spec in plan.processes
        if is_multinode_torchrun(spec)
    }
    try:
        for spec in plan.processes:
            log = step_log(spec, logs)
            health = fill(spec.healthcheck_url, plan, spec.node_index) if spec.healthcheck_url else None
            c = sup.start(
                spec.name,
                spec.role,
                step_argv(plan, spec, run, log, python=python, container=container),
                env,
                log,
                health_url=health,
            )
            _job_log(f"started {spec.name} (srun pid {c.proc.pid}, log {log})")
        try:
            sup.wait_ready(interrupt=lambda: sup.signalled is not None)
        except ComponentFailed as e:
            first = e.child
        except TimeoutError as e:  # ends the job like a failed step
            return _teardown(sup, None, 1, reason=str(e))
        if first is None:
            first = sup.watch()
    except LeaseLost as e:
        _job_log(f"{e}; stopping every step of this attempt now")
        sup.stop_all(term_wait_s=0.0)
        return settle_job(run, lost=True)
    # The handlers stay: a later signal (the time limit's TERM while the trainer checkpoints) must not kill the
    # supervisor before it has stopped its steps.
    if sup.signalled is not None and sup.signalled == preempt:
        # Pre-timeout signal: checkpoint, wait for its COMPLETE marker (bounded), then requeue this job.
        _job_log(f"received SIG{s.signal}: asking the trainer to checkpoint")
        since = time.time()
        sup.request_stop()
        grace = s.checkpoint_grace_s
        if _wait(lambda: newest_complete_since(run, since) is not None, grace):
            _job_log("checkpoint complete")
        else:
            _job_log(
                f"no complete checkpoint within {grace:g} s; requeueing anyway (resume uses the newest complete one)"
            )
        _requeue(env)
        # Recorded and said before the steps are stopped: Slurm kills this batch shell once the requeue's grace
        # (KillWait) has passed, which the steps' shutdown can outlast, and a line not yet printed is lost.
        status = settle_job(run, requeued=True)
        sup.stop_all()
        return status
    if sup.signalled is not None:
        name = signal.Signals(sup.signalled).name
        _job_log(f"received {name}: stopping")
        sup.request_stop()
        sup.stop_all()
        cancel_replicas(run, say=_job_log)  # the run ends here: its elastic replicas go with it
        # scancel / srl cancel, or the time limit: toolkit.run.ending tells them apart.
        return settle_job(run, signalled=name.removeprefix("SIG"))
    assert first is not None
    if sup.stall is not None and s.requeue:
        why = _stall_restart(run, cfg.monitors.stall_restarts, sup.stall, env)
        if why is not None and _requeue(env):
            from ..run import ending

            _job_log(why)
            # Recorded and said before the steps are stopped, as above: the requeue's kill of this batch shell cut
            # the ending line off in a CI run.
            end = ending.settle(run, requeued=True, requeued_reason=why, stalled=sup.stall.role)
            print(end.line(), flush=True)
            sup.request_stop()  # nothing can checkpoint: the stuck role was killed; resume takes the newest COMPLETE
            sup.stop_all()
            return end.exit_status
    return _teardown(sup, first, exit_status(first.returncode), reason=_failure_reason(plan, first, rdzv_logs))


def _requeue(env: dict[str, str]) -> bool:
    """``scontrol requeue`` this batch job (it starts again once this one has ended); False when Slurm refused."""
    from .slurm import SlurmCommandError, requeue

    try:
        requeue(env.get("SLURM_JOB_ID", ""))
    except SlurmCommandError as e:
        _job_log(f"scontrol requeue failed: {e}")
        return False
    return True


def _stall_restart(run: RunDir, allowed: int, stall: watchdog.Stall, env: dict[str, str]) -> str | None:
    """When this Slurm job may still be requeued for a stall (fewer than ``allowed`` lines of this job in
    ``launcher/stall_restarts.jsonl``, ``monitors.stall_restarts``), append one and return what the job log and
    the ending say; None when the stall ends the run."""
    job = env.get("SLURM_JOB_ID", "")
    try:
        lines = run.stall_restarts.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        lines = []
    used = 0
    for line in lines:
        with contextlib.suppress(ValueError, AttributeError):
            used += json.loads(line).get("job") == job
    if used >= allowed:
        _job_log(f"stall: {used} of monitors.stall_restarts = {allowed} requeues used by this job; the run ends")
        return None
    why = (
        f"{stall.message()}; every role restarts from the newest complete checkpoint (stall restart {used + 1} "
        f"of {allowed}, monitors.stall_restarts)"
    )
    append_jsonl(run.stall_restarts, {"time": time.time(), "job": job, "role": stall.role, "reason": stall.message()})
    return why


def _term_steps(children: list[Child], env: dict[str, str]) -> list[Child]:
    """The signal to end (:data:`STEP_STOP_SIGNALS`, else SIGTERM) to every process of the job steps of
    ``children`` (srun processes of this job, their steps named by :func:`step_argv`) through Slurm
    (:func:`toolkit.launch.slurm.signal_steps`); returns the children whose step was not signalled (not listed by
    squeue, or squeue/scancel failed), to be stopped through their srun."""
    from .slurm import SlurmCommandError, job_steps, signal_steps

    # A het job's steps belong to its components' job ids (SLURM_JOB_ID is the first component's).
    jobs = dict.fromkeys(
        [env.get("SLURM_JOB_ID", ""), *(v for k, v in sorted(env.items()) if k.startswith("SLURM_JOB_ID_HET_GROUP_"))]
    )
    try:
        steps = job_steps([j for j in jobs if j], env=env)
    except SlurmCommandError as e:
        _job_log(f"cannot list the job's steps ({e}); stopping them through srun")
        return children
    missed = []
    for c in children:
        ids = steps.get(c.name)
        why = None if ids else f"squeue lists no step named {c.name}"
        if ids:
            try:  # one step at a time: a step that ended meanwhile makes scancel fail, and only that step's
                signal_steps(ids, STEP_STOP_SIGNALS.get(c.role, "TERM"), env=env)
            except SlurmCommandError as e:
                why = str(e)
        if why and c.proc.poll() is None:
            _job_log(f"cannot signal {c.name}'s step through Slurm ({why}); stopping it through srun")
            missed.append(c)
    return missed


def _srun_probe(host: str, pids: list[int], env: dict[str, str]) -> dict[int, str | None]:
    """The states of ``pids`` on node ``host`` of this job, each asked for its stacks unless stopped
    (:func:`toolkit.launch.watchdog.remote_probe_script` through an overlapping ``srun``, bounded by
    :data:`REMOTE_PROBE_TIMEOUT_S`); {} when the node cannot be reached."""
    argv = [
        "srun",
        "--overlap",
        f"--jobid={env.get('SLURM_JOB_ID', '')}",
        "--nodes=1",
        "--ntasks=1",
        f"--nodelist={host}",
        "sh",
        "-c",
        watchdog.remote_probe_script(pids),
    ]
    try:
        r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=REMOTE_PROBE_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        _job_log(f"watchdog: cannot look at processes {pids} on {host}: {e}", error=True)
        return {}
    return watchdog.parse_probe(r.stdout)


def exit_status(rc: int | None) -> int:
    """A process's exit status as the shell reports it (a Popen status of -N, killed by signal N, is 128 + N, as
    srun reports a step killed by a signal)."""
    return 1 if rc is None else (128 - rc if rc < 0 else rc)


def _failure_reason(plan: Plan, first: Child, rdzv_logs: dict[str, rendezvous.StepLogs]) -> str | None:
    """What to tell the user about step ``first``'s failure beyond its exit status: for a multi-node torchrun step
    whose rendezvous did not complete, the trainer nodes that never joined (:mod:`toolkit.launch.rendezvous`)."""
    logs = rdzv_logs.get(first.name)
    if first.returncode in (0, None) or logs is None:
        return None
    return rendezvous.rendezvous_failure(plan, plan.process(first.name), logs.texts(), logs.paths)


def _teardown(sup: Supervisor, first: Child | None, status: int, reason: str | None = None) -> int:
    """End the job after ``first`` ended (None: the engines never became ready) with ``status`` (:meth:`Supervisor.end`,
    ``slurm.checkpoint_grace_s`` for the trainer and orchestrator); ``reason``: why ``first`` failed, in words,
    when more is known than its exit status. Returns the job's exit status."""
    name = first.name if first is not None else "inference"
    if sup.stall is not None:
        _job_log(f"teardown: the watchdog stopped {name}: {sup.stall.message()}")
    else:
        _job_log(f"teardown: {name} exited first (status {status})")
    if status and reason and sup.stall is None:
        _job_log(f"{name} failed: {reason}", error=True)
    end = sup.end(first, reason=reason)
    cancel_replicas(sup.run, say=_job_log)  # the run ended: its elastic replicas go with it
    print(end.line(), flush=True)
    return end.exit_status


def main(argv: list[str] | None = None) -> int:
    """The batch job's entry point (arguments: see the module docstring). Returns the job's exit status."""
    ap = argparse.ArgumentParser(prog="python -m toolkit.launch.supervisor")
    ap.add_argument("--run-dir", required=True, type=Path)
    ap.add_argument("--attempt", type=int, default=None)
    ap.add_argument("--kind", choices=("rl", "inference", "eval"), default="rl")
    ap.add_argument("--secret", action="append", default=[])
    a = ap.parse_args(sys.argv[1:] if argv is None else argv)
    return run_job(RunDir(a.run_dir), attempt=a.attempt, kind=a.kind, secrets=a.secret)


if __name__ == "__main__":
    sys.exit(main())
