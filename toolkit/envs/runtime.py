"""``EnvRuntime``: the orchestrator's handle on one environment (taskset + plain chat harness) and its workers.

``start()`` spawns ``pool.max_workers`` env worker processes (``toolkit.envs.server``) or, when ``env_cfg.address``
is set, connects to externally managed ones (``"host:port"``, a comma-separated list, or a list). ``run_group``
runs ``group_size`` rollouts of one task concurrently, token-in/token-out through the given policy client, with
these bounds:

- stage timeouts (seconds) from ``env_cfg.timeout``: ``setup``, ``finalize`` and ``scoring`` bound the worker's
  task hooks (expiry = TaskError); ``rollout`` bounds the whole episode (expiry = HarnessError, the harness turns
  did not finish in time);
- transient classes (ProviderError, SandboxError, TunnelError) are retried ``env_cfg.retries`` times with
  exponential backoff (0.5 s, 1 s, 2 s, ... capped at 30 s, times a seeded jitter in [1, 1.5)); deterministic classes
  are not retried;
- a rollout that still fails comes back with ``error_class`` set and no training samples.

A worker that stops answering within its stage timeout (e.g. a scorer stuck in a CPU loop), or that cannot
answer a health check after a rollout timeout, is killed and restarted; the episodes it held fail as SandboxError
and are retried. A worker that died is restarted before its next episode.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import json
import logging
import os
import random
import signal
import sys
import uuid
from pathlib import Path
from typing import Any

from toolkit import errors as srl_errors
from toolkit.envs.probe import probe_spec
from toolkit.envs.protocol import READY_PREFIX, WorkerConnection, unwrap
from toolkit.envs.rollout import RolloutLimits, run_rollout, wait_excluding_outage
from toolkit.models.renderer import CachedRenderer, Renderer, load_renderer
from toolkit.procutil import exit_words
from toolkit.run.types import TRANSIENT_ERRORS, Rollout, SamplingParams, TrainingSample

log = logging.getLogger("srl.orchestrator")

WORKER_START_TRIES = 2
"""Starts of a worker killed by a signal before it announced itself (a worker that exits with a status is not
started again: its refusal or import error would only repeat)."""


class WorkerStartError(RuntimeError):
    """An env worker did not announce itself; ``returncode`` is its exit status (negative: the signal that killed
    it; None: it was still running when given up on)."""

    def __init__(self, message: str, returncode: int | None) -> None:
        super().__init__(message)
        self.returncode = returncode


# Generous: a worker imports verifiers (~9 s of CPU) and, on a loaded node or a slow shared filesystem, far more.
WORKER_START_TIMEOUT_S = 600.0
BACKOFF_BASE_S = 0.5
BACKOFF_MAX_S = 30.0
MAX_WORKER_LOG_LINES = 1000
"""Lines of a worker's stderr copied into the orchestrator log (a start-up message, warnings, a crash's traceback)."""
GRACE_S = 5.0  # client-side slack over the worker's own stage timeout before the worker is presumed hung


def _timeouts(env_cfg: Any) -> dict[str, float | None]:
    """Seconds allowed per stage of an episode (``env_cfg.timeout``)."""
    return {s: getattr(env_cfg.timeout, s) for s in ("setup", "rollout", "finalize", "scoring")}


def _timeouts_given(env_cfg: Any) -> list[str]:
    """The stages whose timeout the user moved off srl's default (a resolved config spells out every field, so
    the fields set are not a user's choice any more); on the trace path they bound verifiers' own stages."""
    from toolkit.config.model import TimeoutConfig

    defaults = TimeoutConfig.model_fields
    return sorted(k for k, v in _timeouts(env_cfg).items() if v is not None and v != defaults[k].default)


def env_spec(env_cfg: Any) -> dict[str, Any]:
    """The JSON spec an env worker is started with (see ``toolkit.envs.server``): what preflight probes of the env
    (``toolkit.envs.probe.probe_spec``) plus its turn and time limits."""
    return {
        **probe_spec(env_cfg),
        "max_turns": env_cfg.max_turns,
        "timeout": _timeouts(env_cfg),
        "timeout_given": _timeouts_given(env_cfg),
        "max_total_tokens": getattr(env_cfg, "max_total_tokens", None),
    }


def _addresses(address: Any) -> list[tuple[str, int]]:
    items = address if isinstance(address, (list, tuple)) else str(address).split(",")
    out = []
    for item in items:
        host, _, port = str(item).strip().rpartition(":")
        out.append((host or "127.0.0.1", int(port)))
    return out


class _Worker:
    """A worker process we own (``proc`` set) or an external address, with its live connection."""

    def __init__(self, host: str, port: int, proc: asyncio.subprocess.Process | None) -> None:
        self.host, self.port, self.proc = host, port, proc
        self.conn = WorkerConnection(host, port)
        self.restarting: asyncio.Task | None = None


class _GroupStart:
    """The first attempt of every rollout of a group starts in one ``start_group`` request on one worker; each
    session (``sessions[k]``) takes its own result, so one episode's setup error fails only that rollout."""

    def __init__(self, runtime: EnvRuntime, worker: _Worker, example_id: int, size: int) -> None:
        self.runtime, self.worker, self.example_id = runtime, worker, example_id
        self.sessions = [_RemoteSession(runtime, worker, example_id, group=self, index=k) for k in range(size)]
        self.task = asyncio.ensure_future(self._run())

    async def _run(self) -> list[dict[str, Any]]:
        await self.runtime._ready(self.worker)
        limit = self.runtime.timeouts.get("setup")
        r = await self.runtime._call(
            self.worker,
            "start_group",
            limit,
            f"env worker did not answer start within {limit} s (+{GRACE_S} s)",
            example_id=self.example_id,
            episodes=[x.episode for x in self.sessions],
        )
        return list(r["results"])

    async def outcome(self, index: int) -> dict[str, Any]:
        """Episode ``index``'s start result. Raises its error class (every session of the group raises when the
        request as a whole failed, e.g. a lost worker: SandboxError)."""
        try:
            # Shielded: a rollout cancelled while waiting (its timeout) must not cancel its group mates' start.
            results = await asyncio.shield(self.task)
        except srl_errors.SrlRolloutError as exc:
            raise type(exc)(str(exc)) from exc  # a fresh exception per rollout (they are raised concurrently)
        return unwrap(results[index])

    def started_ok(self, index: int) -> bool:
        """Whether episode ``index`` is known to exist on the worker (its start finished without error)."""
        t = self.task
        if not t.done() or t.cancelled() or t.exception() is not None:
            return False
        return bool(t.result()[index].get("ok"))


class _RemoteSession:
    """An ``EnvSession`` backed by one episode on one worker (started alone, or as part of a ``_GroupStart``).

    A single-turn task's step asks for the score in the same request (``finish``), so such a rollout costs one
    request of its own after the group's start.
    """

    def __init__(
        self, runtime: EnvRuntime, worker: _Worker, example_id: int, *, group: _GroupStart | None = None, index: int = 0
    ) -> None:
        self.runtime, self.worker, self.example_id = runtime, worker, example_id
        self.group, self.index = group, index
        self.episode = uuid.uuid4().hex
        self.started = False  # the episode exists on the worker and has not been finished
        self.single_turn = False
        self.scored: dict[str, Any] | None = None  # the score that came with the last step
        self._group_start_pending = group is not None  # its start result not taken yet (close() checks the group)

    async def _call(self, op: str, stage: str | None, **params: Any) -> dict[str, Any]:
        limit = self.runtime.timeouts.get(stage) if stage else None
        return await self.runtime._call(
            self.worker,
            op,
            limit,
            f"env worker did not answer {op} within {limit} s (+{GRACE_S} s)",
            episode=self.episode,
            **params,
        )

    async def start(self) -> tuple[str, list[dict[str, str]]]:
        if self.group is not None:
            try:
                r = await self.group.outcome(self.index)
            except srl_errors.SrlRolloutError:
                self._group_start_pending = False  # no episode on the worker
                raise
            self._group_start_pending = False
        else:
            r = await self._call("start", "setup", example_id=self.example_id)
        self.started = True
        self.single_turn = bool(r.get("single_turn"))
        return r["task_id"], r["messages"]

    async def _scoring_call(self, op: str, **params: Any) -> dict[str, Any]:
        """``op`` bounded by the finalize + scoring timeouts (+ grace): a worker that does not answer in time is
        replaced and the rollout fails as TaskError."""
        limit = sum(self.runtime.timeouts.get(s) or 0 for s in ("finalize", "scoring"))
        return await self.runtime._call(
            self.worker,
            op,
            limit or None,
            f"env worker did not finish scoring within {limit} s",
            episode=self.episode,
            **params,
        )

    async def step(self, reply: str) -> tuple[list[dict[str, str]], bool]:
        if self.single_turn:  # this step ends the episode (no user turn): its score comes with the answer
            try:
                r = await self._scoring_call("step", reply=reply, finish=True)
            finally:
                self.started = False  # scored and forgotten by the worker, or failed: nothing to close
            self.scored = r.get("scored")
        else:
            r = await self._call("step", None, reply=reply)
        return r["messages"], bool(r["done"])

    async def finish(self) -> dict[str, Any]:
        if self.scored is not None:
            out, self.scored = self.scored, None
            return unwrap(out)
        try:
            return await self._scoring_call("finish")
        finally:
            self.started = False

    async def close(self) -> None:
        if self._group_start_pending and self.group is not None:
            # Cancelled before taking its start result: the episode may exist on the worker all the same.
            self._group_start_pending = False
            self.started = self.group.started_ok(self.index)
        if self.started and not self.worker.conn.closed:
            with contextlib.suppress(TimeoutError, srl_errors.SrlRolloutError):
                await self.worker.conn.call("close", 5.0, episode=self.episode)


class EnvRuntime:
    """One environment of the orchestrator. See the module docstring for the failure semantics.

    ``env_cfg``: the env entry (name, taskset, harness, timeout, max_turns, max_total_tokens, retries, pool,
    address); ``model_path``: the policy's HF directory (tokenizer and chat template for the renderer);
    ``renderer_cfg``: ``name``/``import_path``; ``seed``: seeds the retry backoff jitter.
    """

    def __init__(self, env_cfg: Any, *, model_path: Path, renderer_cfg: Any, seed: int) -> None:
        self.env_cfg = env_cfg
        self.name: str = env_cfg.name
        self.model_path = Path(model_path)
        self.renderer_cfg = renderer_cfg
        self.timeouts: dict[str, float | None] = _timeouts(env_cfg)
        self.retries: int = env_cfg.retries
        self.limits = RolloutLimits(env_cfg.max_turns, env_cfg.max_total_tokens)
        self.renderer: Renderer | None = None
        self.workers: list[_Worker] = []
        self.num_examples = 0
        self.task_ids: list[str] = []
        self._spec = b"{}"
        self.mode = "chat"
        """The workers' episode path: ``chat`` (srl's plain chat loop, turn by turn from here) or ``trace``
        (verifiers' own rollout in the worker, model turns called back here; ``toolkit.envs.traces``)."""
        self._rr = 0
        self._rng = random.Random(seed)
        self._demonstrations: dict[tuple[int, str], str | None] = {}  # self-distillation's, asked once per task

    @property
    def pids(self) -> list[int]:
        """Process ids of the workers this runtime started and that still run (none for an external address)."""
        return [w.proc.pid for w in self.workers if w.proc is not None and w.proc.returncode is None]

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        """Load the renderer, start or connect to the workers and read the task list.

        Raises RuntimeError when a worker fails to start (its stderr tail is in the message).
        """
        # Cached: a group's rollouts open with the same conversation (one template render per group).
        self.renderer = CachedRenderer(load_renderer(self.renderer_cfg, self.model_path))
        address = self.env_cfg.address
        if address:
            self.workers = [_Worker(host, port, None) for host, port in _addresses(address)]
        else:
            # The policy's model and renderer: a worker that runs verifiers' rollout renders the turns itself.
            policy = {
                "model_path": str(self.model_path),
                "renderer": {
                    "name": getattr(self.renderer_cfg, "name", None),
                    "import_path": getattr(self.renderer_cfg, "import_path", None),
                },
            }
            self._spec = json.dumps({**env_spec(self.env_cfg), "policy": policy}).encode()
            n = self.env_cfg.pool.max_workers
            started = await asyncio.gather(*(self._spawn() for _ in range(max(1, n))), return_exceptions=True)
            self.workers = [w for w in started if isinstance(w, _Worker)]  # aclose stops these even on failure
            failed = [e for e in started if isinstance(e, BaseException)]
            if failed:
                raise failed[0]
        for w in self.workers:
            await w.conn.connect()
        info = await self.workers[0].conn.call("info", WORKER_START_TIMEOUT_S)
        self.num_examples, self.task_ids = int(info["num_examples"]), list(info["task_ids"])
        self.mode = str(info.get("mode") or "chat")
        if self.mode == "trace":
            log.info(
                "env %s runs through verifiers' own rollout in its workers: %s",
                self.name,
                "; ".join(info.get("reasons") or []),
            )
        if info.get("source"):  # where the worker, on its node and with its PYTHONPATH, found the taskset
            tid = getattr(getattr(self.env_cfg, "taskset", None), "id", "?")
            log.info("env %s: taskset %s resolved to %s", self.name, tid, info["source"])

    async def _spawn(self) -> _Worker:
        """Start one worker process; a worker killed by a signal before it announced itself (the OOM killer, a
        crash in a native library) is started again, up to WORKER_START_TRIES times in all. Raises
        WorkerStartError: a worker that exits with a status (a refusal, an import error) is not tried again."""
        for attempt in range(1, WORKER_START_TRIES + 1):
            try:
                return await self._spawn_once()
            except WorkerStartError as exc:
                if exc.returncode is None or exc.returncode >= 0 or attempt == WORKER_START_TRIES:
                    raise
                log.warning(
                    "%s; starting it again (try %d of %d)", str(exc).splitlines()[0], attempt + 1, WORKER_START_TRIES
                )
        raise AssertionError("unreachable")

    async def _spawn_once(self) -> _Worker:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "toolkit.envs.server",
            "--spec",
            "-",
            "--port",
            "0",
            "--parent-pid",
            str(os.getpid()),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        # The spec goes through stdin: no file to clean up, whatever happens to this process.
        proc.stdin.write(self._spec)
        await proc.stdin.drain()
        proc.stdin.close()
        # Drained from the start (a worker that writes much while importing must not block on a full pipe); the
        # tail is the evidence of a failed start.
        tail: collections.deque[str] = collections.deque(maxlen=60)
        stderr = asyncio.create_task(self._drain(proc, proc.stderr, "stderr", tail))
        try:
            address, before, timed_out = await self._announced(proc)
        except BaseException:  # cancelled while starting: do not leave the child behind
            proc.kill()
            await proc.wait()
            raise
        if address is None:
            with contextlib.suppress(TimeoutError):  # stdout closed: it is exiting; say how
                await asyncio.wait_for(proc.wait(), GRACE_S)
            status, how = proc.returncode, exit_words(proc.returncode)
            if status is None:  # given up on here: its status would only be this kill
                how = f"no announcement within {WORKER_START_TIMEOUT_S:g} s" if timed_out else "stdout closed"
                how += "; killed"
                proc.kill()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(proc.wait(), stderr), GRACE_S)
            err = "\n".join(tail)[-3000:]
            printed = f"; it printed on stdout: {' | '.join(before[-5:])[-1000:]}" if before else ""
            raise WorkerStartError(f"env worker for {self.name!r} failed to start ({how}){printed}\n{err}", status)
        asyncio.create_task(self._drain(proc, proc.stdout, "stdout"))
        host, _, port = address.rpartition(":")
        return _Worker(host, int(port), proc)

    async def _announced(self, proc: asyncio.subprocess.Process) -> tuple[str | None, list[str], bool]:
        """Read the worker's stdout until it announces its ``host:port`` (``READY_PREFIX host:port``); returns
        (address, the lines printed before it, timed out): address None when stdout closed or WORKER_START_TIMEOUT_S
        passed first. Lines before the announcement are logged, never taken for it: a library the taskset imports may
        print on stdout (a blank line was once taken for a failed start)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WORKER_START_TIMEOUT_S
        before: list[str] = []
        while (left := deadline - loop.time()) > 0:
            try:
                line = await asyncio.wait_for(proc.stdout.readline(), left)
            except TimeoutError:
                break
            except ValueError:  # a line over the stream's limit (readline dropped it): not the announcement
                before.append("<a line too long to read>")
                continue
            if not line:
                return None, before, False
            text = line.decode(errors="replace").strip()
            if text.startswith(READY_PREFIX) and len(text.split()) == 2:
                return text.split()[1], before, False
            if text:
                log.info("env worker %s (pid %d) on stdout: %s", self.name, proc.pid, text[:2000])
                before.append(text)
        return None, before, True

    async def _drain(
        self, proc: asyncio.subprocess.Process, stream: Any, label: str, tail: collections.deque[str] | None = None
    ) -> None:
        """Copy one of the worker's output streams into this log line by line (a task's prints, verifiers'
        warnings, a crash's traceback: the evidence of a failing env), so a chatty task cannot block the worker on a
        full pipe. ``tail`` keeps the last lines (all of them, logged or not) until the stream closes."""
        pending, logged = b"", 0
        with contextlib.suppress(OSError, ValueError):
            while chunk := await stream.read(65536):  # chunks, not readline: a line may exceed any limit
                *lines, pending = (pending + chunk).split(b"\n")
                pending = pending[-65536:]
                texts = [t for line in lines if (t := line.decode(errors="replace").rstrip())]
                if tail is not None:
                    tail.extend(texts)
                if logged > MAX_WORKER_LOG_LINES:
                    continue  # a task printing per episode must not flood the log or load this event loop
                where = "" if label == "stderr" else f" on {label}"
                for text in texts:
                    logged += 1
                    log.info("env worker %s (pid %d)%s: %s", self.name, proc.pid, where, text[:2000])
                if logged > MAX_WORKER_LOG_LINES:
                    log.info(
                        "env worker %s (pid %d): more than %d lines on %s; the rest is not logged",
                        self.name,
                        proc.pid,
                        MAX_WORKER_LOG_LINES,
                        label,
                    )
        if tail is not None and (last := pending.decode(errors="replace").rstrip()):
            tail.append(last)  # a crash's last words may lack their newline

    async def _call(self, worker: _Worker, op: str, limit: float | None, failure: str, **params: Any) -> Any:
        """``op`` on ``worker``, answered within ``limit`` + GRACE_S seconds (None: no bound). A worker that does not
        answer in time is replaced and the call raises TaskError(``failure``)."""
        conn = worker.conn
        try:
            return await conn.call(op, None if limit is None else limit + GRACE_S, **params)
        except TimeoutError as exc:
            self._schedule_restart(worker, conn)
            raise srl_errors.TaskError(failure) from exc

    def _schedule_restart(self, worker: _Worker, failed: WorkerConnection) -> None:
        """Start replacing a hung or dead worker in the background (its episodes fail as SandboxError).

        ``failed`` is the connection the caller saw fail; if the worker was already replaced since, or is being
        replaced, nothing happens (several rollouts may notice the same failure). The restart runs as the
        runtime's own task, so the rollout that noticed the failure returns at once and a rollout timeout cannot
        cancel it half-way.
        """
        if worker.conn is failed and (worker.restarting is None or worker.restarting.done()):
            worker.restarting = asyncio.create_task(self._restart(worker, failed))

    async def _restart(self, worker: _Worker, failed: WorkerConnection) -> None:
        """Replace ``worker``'s process by a fresh one (an external worker is only reconnected)."""
        await failed.close()
        failed._fail_all(f"env worker {failed.address} restarted after a failure")
        if worker.proc is not None:
            await self._stop_proc(worker.proc)
            fresh = await self._spawn()
            worker.host, worker.port, worker.proc = fresh.host, fresh.port, fresh.proc
        conn = WorkerConnection(worker.host, worker.port)
        await conn.connect()
        worker.conn = conn

    async def _ready(self, worker: _Worker) -> None:
        """Wait for a restart of ``worker`` in flight; restart it first if its connection was lost."""
        if worker.conn.closed:
            self._schedule_restart(worker, worker.conn)
        if worker.restarting is not None and not worker.restarting.done():
            try:
                await asyncio.shield(worker.restarting)
            except RuntimeError as exc:  # the replacement failed to start: a runtime (sandbox) failure
                raise srl_errors.SandboxError(str(exc)) from exc

    @staticmethod
    async def _stop_proc(proc: asyncio.subprocess.Process, grace_s: float = 5.0) -> None:
        if proc.returncode is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), grace_s)
        except TimeoutError:
            proc.kill()
            await proc.wait()

    async def aclose(self) -> None:
        """Close connections and stop every worker process this runtime started (SIGTERM, then SIGKILL)."""
        for w in self.workers:
            if w.restarting is not None and not w.restarting.done():
                with contextlib.suppress(RuntimeError, srl_errors.SrlRolloutError):
                    await w.restarting
            await w.conn.close()
        await asyncio.gather(*(self._stop_proc(w.proc) for w in self.workers if w.proc is not None))
        self.workers = []

    # -- tasks and rollouts ---------------------------------------------------------------------
    def example_ids(self, n: int | None = None) -> list[int]:
        """The selected examples' ids (positions after ``select``), the first ``n`` of them when n is given."""
        ids = list(range(self.num_examples))
        return ids if n is None else ids[:n]

    async def demonstration(self, example_id: int, key: str) -> str | None:
        """Task ``example_id``'s demonstration for self-distillation (its data field ``key``, or ``info[key]``;
        None when it has none), asked of a worker once per task and kept. Raises TaskError."""
        cache = self._demonstrations
        if (example_id, key) not in cache:
            worker = self._pick_worker()
            await self._ready(worker)
            answer = await self._call(
                worker,
                "demonstration",
                self.timeouts.get("setup"),
                f"env {self.name}: no answer to the demonstration of task {example_id}",
                example_id=example_id,
                key=key,
            )
            cache[(example_id, key)] = answer.get("text")
        return cache[(example_id, key)]

    def _pick_worker(self) -> _Worker:
        live = [w for w in self.workers if not w.conn.closed] or self.workers
        self._rr += 1
        return min(live, key=lambda w: (w.conn.inflight, (self._rr + live.index(w)) % len(live)))

    async def _attempt(
        self, example_id: int, client: Any, sampling: SamplingParams, session: _RemoteSession | None = None
    ) -> list[Rollout]:
        """One attempt at an episode: its rollouts (one; through verifiers' rollout, one per trainable trace)."""
        if self.mode == "trace":
            return await self._trace_attempt(example_id, client, sampling)
        return [await self._chat_attempt(example_id, client, sampling, session)]

    async def _chat_attempt(
        self, example_id: int, client: Any, sampling: SamplingParams, session: _RemoteSession | None
    ) -> Rollout:
        if session is None:
            session = _RemoteSession(self, self._pick_worker(), example_id)
        worker = session.worker
        # It died since the last call (crash) or is being replaced: wait here, before the rollout's clock starts
        # (a group's start request waits for the same restart).
        await self._ready(worker)
        session_id = f"{self.name}-{example_id}-{session.episode[:12]}"
        try:
            return await self._within_rollout_timeout(
                worker,
                client,
                run_rollout(
                    session,
                    client=client,
                    renderer=self.renderer,
                    sampling=sampling,
                    env_name=self.name,
                    example_id=example_id,
                    session_id=session_id,
                    limits=self.limits,
                ),
            )
        finally:
            await session.close()

    async def _within_rollout_timeout(self, worker: _Worker, client: Any, coro: Any) -> Any:
        """``coro`` bounded by the rollout timeout, engine outages excluded. Raises HarnessError on expiry (after
        replacing ``worker`` if it no longer answers)."""
        try:
            return await wait_excluding_outage(coro, self.timeouts.get("rollout"), client)
        except TimeoutError as exc:
            await self._restart_if_unresponsive(worker)
            raise srl_errors.HarnessError(f"rollout timed out after {self.timeouts['rollout']} s") from exc

    async def _trace_attempt(self, example_id: int, client: Any, sampling: SamplingParams) -> list[Rollout]:
        """One episode through verifiers' rollout on a worker (``run_trace``); its model turns come back to this
        process as ``generate`` callbacks, answered by ``client`` (the policy client: its retries, its serving
        gate, the policy version of each turn). One Rollout per trainable trace of the episode."""
        worker = self._pick_worker()
        await self._ready(worker)
        episode = uuid.uuid4().hex
        conn = worker.conn
        clipped_and_cut = False  # a turn the budget clipped ran out: the rollout's truncation is the budget's

        async def on_callback(op: str, params: dict[str, Any]) -> dict[str, Any]:
            nonlocal clipped_and_cut
            if op != "generate":
                raise srl_errors.HarnessError(f"env worker asked for unknown callback {op!r}")
            prompt, turn = list(params["prompt_ids"]), SamplingParams(**params["sampling"])
            cap = self.limits.max_total_tokens
            if cap is not None:
                # Prompt + completion stays within the rollout's budget (and so within the trainer's rows), as in
                # the chat loop: the turn is clipped to what is left; with nothing left it is empty, cut by length
                # (verifiers then stops the episode on its own max_total_tokens, the seat's limit).
                left = cap - len(prompt)
                if left <= 0:
                    clipped_and_cut = True
                    return {
                        "token_ids": [],
                        "logprobs": [],
                        "finish_reason": "length",
                        "policy_version": 0,
                        "foreign_version": None,
                    }
                if left < turn.max_tokens:
                    turn = dataclasses.replace(turn, max_tokens=left)
                    clipped = True
                else:
                    clipped = False
            gen = await client.generate(prompt, turn, session_id=str(params.get("session_id") or episode))
            if cap is not None and clipped and gen.finish_reason == "length":
                clipped_and_cut = True
            return {
                "token_ids": list(gen.token_ids),
                "logprobs": [float(x) for x in gen.logprobs],
                "finish_reason": gen.finish_reason,
                "policy_version": int(gen.policy_version),
                "foreign_version": gen.foreign_version,
            }

        conn.callbacks[episode] = on_callback
        done = False
        try:
            call = conn.call("run_trace", example_id=example_id, episode=episode, sampling=dataclasses.asdict(sampling))
            r = await self._within_rollout_timeout(worker, client, call)
            done = True
        finally:
            conn.callbacks.pop(episode, None)
            if not done and not conn.closed:
                # Timed out or cancelled here: the worker ends the episode too (its harness program, tool servers
                # and runtime), instead of running it on with nobody waiting.
                cancel = asyncio.ensure_future(conn.call("cancel", GRACE_S, episode=episode))
                cancel.add_done_callback(lambda t: t.cancelled() or t.exception())
        return [
            Rollout(
                env=self.name,
                task_id=str(t["task_id"]),
                example_id=example_id,
                samples=[TrainingSample(**s) for s in t["samples"]],
                reward=float(t["reward"]),
                reward_components=dict(t.get("components") or {}),
                metrics=dict(t.get("metrics") or {}),
                num_turns=int(t.get("num_turns") or 0),
                truncated=bool(t.get("truncated")),
                truncation_reason=(
                    "max_total_tokens" if clipped_and_cut and t.get("truncated") else t.get("truncation_reason")
                ),
                policy_version=int(t.get("policy_version") or 0),
                foreign_version=t.get("foreign_version"),
                timings=dict(t.get("timings") or {}),
                seat=t.get("seat"),
            )
            for t in r["traces"]
        ]

    async def _restart_if_unresponsive(self, worker: _Worker) -> None:
        """After a rollout timeout: a worker that cannot answer ``health`` within GRACE_S is stuck (e.g. a
        blocking ``user_turn``) and would stall every later episode, so it is replaced."""
        conn = worker.conn
        try:
            await conn.call("health", GRACE_S)
        except TimeoutError:
            self._schedule_restart(worker, conn)
        except srl_errors.SrlRolloutError:
            pass  # connection already lost: the next attempt restarts it

    async def run_episode(
        self, example_id: int, *, client: Any, sampling: SamplingParams, first: _RemoteSession | None = None
    ) -> list[Rollout]:
        """One episode with retries of transient failures: its rollouts (one from the chat loop; one per trainable
        trace from verifiers' rollout), or one errored Rollout (no samples) when it fails. ``first``: the session
        of the first attempt (a group's pre-started one); retries start their own."""
        errors: list[str] = []
        for attempt in range(self.retries + 1):
            try:
                rollouts = await self._attempt(example_id, client, sampling, first if attempt == 0 else None)
                if errors:
                    for rollout in rollouts:
                        rollout.metrics["retries"] = float(len(errors))
                return rollouts
            except srl_errors.SrlRolloutError as exc:
                errors.append(f"{exc.error_class}: {exc}")
                if exc.error_class in TRANSIENT_ERRORS and attempt < self.retries:
                    jitter = 1.0 + 0.5 * self._rng.random()  # spreads retries of a failed group apart
                    await asyncio.sleep(min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2**attempt) * jitter)
                    continue
                return [self._errored(example_id, exc.error_class, errors)]
        raise AssertionError("unreachable")

    def _errored(self, example_id: int, error_class: str, errors: list[str]) -> Rollout:
        task_id = self.task_ids[example_id] if 0 <= example_id < len(self.task_ids) else str(example_id)
        return Rollout(
            env=self.name,
            task_id=task_id,
            example_id=example_id,
            samples=[],
            error_class=error_class,
            error_message=errors[-1],
            metrics={"retries": float(len(errors) - 1)},
        )

    async def run_group(
        self, example_id: int, group_size: int, *, client: Any, sampling: SamplingParams
    ) -> list[Rollout]:
        """The rollouts of ``group_size`` episodes of one example, run concurrently; errored ones carry
        ``error_class``. An episode gives one rollout, or through verifiers' rollout one per trainable trace (an
        Env that runs several attempts or several trainable seats): all of them share the group, and each seat's
        traces get the baseline of that seat's traces in the group (``Rollout.seat``; the orchestrator's buffer).

        With ``sampling.seed`` set, rollout k of the group samples with seed ``seed + k``: reproducible, and the
        group stays diverse (one shared seed would give identical completions and no group-relative signal).
        """

        def nth(k: int) -> SamplingParams:
            return sampling if sampling.seed is None else dataclasses.replace(sampling, seed=sampling.seed + k)

        if self.mode == "trace":  # verifiers runs each episode whole: nothing to start ahead
            return _flat(
                await asyncio.gather(
                    *(self.run_episode(example_id, client=client, sampling=nth(k)) for k in range(group_size))
                )
            )
        # The first attempts start together on one worker, in one request (protocol: start_group).
        group = _GroupStart(self, self._pick_worker(), example_id, group_size)
        try:
            return _flat(
                await asyncio.gather(
                    *(
                        self.run_episode(example_id, client=client, sampling=nth(k), first=group.sessions[k])
                        for k in range(group_size)
                    )
                )
            )
        finally:
            if not group.task.done():  # every rollout was cancelled before its start result came
                group.task.cancel()
            await asyncio.gather(group.task, return_exceptions=True)


def _flat(episodes: list[list[Rollout]]) -> list[Rollout]:
    """The rollouts of a group's episodes, in episode order."""
    return [r for rollouts in episodes for r in rollouts]
