"""An env worker process: hosts one env's taskset and runs the environment half of episodes for the orchestrator.

Run as ``python -m toolkit.envs.server --spec SPEC.json|- [--host H] [--port P] [--parent-pid PID]``. It loads and
selects the tasks once, listens (``--port 0`` = OS-assigned), then prints ``SRL_ENV_WORKER_READY host:port`` on
stdout. The orchestrator's ``EnvRuntime`` starts ``pool.max_workers`` of these (or connects to an external one via
``address``); each is its own process, so a task that hangs or crashes cannot stall the orchestrator.

Spec (JSON): ``{"name", "eval", "taskset": {"id", "split", "seed", "select", "extra"}, "harness": {"id",
"runtime"}, "max_turns", "timeout": {"setup", "finalize", "scoring"}}``; timeouts are seconds (None = unbounded);
``eval`` marks an eval env (it must not read train rows); ``runtime``
holds the fields of verifiers' runtime config (``{"type": "subprocess"}`` when absent). An environment srl cannot
run as verifiers would (``toolkit.envs.fidelity``) makes the worker exit before it announces itself, with the
refusal on stderr.
With ``--parent-pid`` the worker exits when that process is gone, so a killed orchestrator leaves no orphans.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import signal
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from toolkit import errors as srl_errors
from toolkit.envs import fidelity, sigcache
from toolkit.envs.episode import Episode
from toolkit.envs.fidelity import task_identity
from toolkit.envs.protocol import (
    READY_PREFIX,
    STREAM_LIMIT,
    CallbackChannel,
    coalesce_writes,
    encode,
    outcome,
    settled,
)
from toolkit.envs.registry import load_selected, taskset_module, taskset_source
from toolkit.procutil import end_descendants
from toolkit.run.heartbeat import enable_stack_dumps

GRACE_S = 2.0
"""Seconds the worker's own processes get between SIGTERM and SIGKILL when it stops."""


def taskset_namespace(spec_taskset: dict[str, Any]) -> SimpleNamespace:
    """The wire taskset spec as the attribute object ``registry.load_tasks`` reads."""
    return SimpleNamespace(
        id=spec_taskset["id"],
        split=spec_taskset.get("split"),
        seed=spec_taskset.get("seed"),
        select=spec_taskset.get("select"),
        model_extra=spec_taskset.get("extra") or {},
    )


def demonstration(task: Any, key: str) -> str | None:
    """The task's demonstration for self-distillation: its data field ``key`` (``data.answer``, ...) or, failing
    that, ``data.info[key]``; None when neither is a string."""
    data = getattr(task, "data", None)
    value = getattr(data, key, None)
    if not isinstance(value, str):
        info = getattr(data, "info", None)
        value = info.get(key) if isinstance(info, dict) else None
    return value if isinstance(value, str) else None


class EnvWorker:
    """The episodes of one worker. ``handle`` runs one request; errors come back as seed error classes."""

    def __init__(self, spec: dict[str, Any]) -> None:
        """Load and select the tasks, choose the episode path (``mode``: ``"chat"``, srl's plain chat loop, or
        ``"trace"``, verifiers' own rollout; ``toolkit.envs.fidelity``) and refuse what neither can run.

        Raises EnvFeatureError (a runtime srl cannot provide, a harness verifiers does not know, a pairing
        verifiers refuses), ValueError or pydantic.ValidationError (taskset, env or seat fields),
        ModuleNotFoundError (an id that resolves nowhere).
        """
        harness = spec.get("harness") or {}
        name = spec.get("name") or spec["taskset"]["id"]
        harness_id = harness.get("id", "default")
        runtime = harness.get("runtime") or {"type": "subprocess"}
        self.runtime_config = fidelity.build_runtime_config(name, runtime)
        fidelity.raise_listed([p for p in [fidelity.harness_id_problem(name, harness_id)] if p])
        taskset, self.tasks = load_selected(
            taskset_namespace(spec["taskset"]), env_name=name, eval_env=bool(spec.get("eval"))
        )
        self.source = taskset_source(spec["taskset"]["id"])
        module = taskset_module(spec["taskset"]["id"])
        self.reasons = fidelity.chat_loop_reasons(name, taskset, self.tasks, harness_id, module)
        self.trace_env = None
        if self.reasons:
            from toolkit.envs.traces import TraceEnv

            self.trace_env = TraceEnv(spec)
            self.tasks = self.trace_env.tasks
            pairing = [
                p
                for h in self.trace_env.harnesses
                for t in self.tasks
                for p in fidelity.pairing_problems(name, t, self.runtime_config, h)
            ]
            fidelity.raise_listed(pairing)
        else:
            fidelity.check_loaded(name, taskset, self.tasks, harness_id, self.runtime_config, module=module)
        self.mode = "trace" if self.trace_env is not None else "chat"
        self.trace_runs: dict[str, asyncio.Future] = {}  # episode id -> its run, for op cancel
        self.max_turns = spec.get("max_turns")
        self.timeout = spec.get("timeout") or {}
        self.episodes: dict[str, Episode] = {}

    async def _staged(self, stage: str, coro):
        limit = self.timeout.get(stage)
        try:
            return await asyncio.wait_for(coro, limit)
        except TimeoutError as exc:
            raise srl_errors.TaskError(f"task {stage} timed out after {limit} s") from exc

    async def handle(self, op: str, req: dict[str, Any], channel: CallbackChannel | None = None) -> dict[str, Any]:
        """Answer request ``op``; ``channel``: callbacks to the orchestrator over the request's connection."""
        if op == "health":
            return {"episodes": len(self.episodes), "pid": os.getpid()}
        if op == "info":
            return {
                "num_examples": len(self.tasks),
                "task_ids": [task_identity(t) for t in self.tasks],
                "source": self.source.describe(),
                "mode": self.mode,
                "reasons": self.reasons,
            }
        if op == "demonstration":  # self-distillation's privileged context: a task field, e.g. its answer
            eid = int(req["example_id"])
            if not 0 <= eid < len(self.tasks):
                raise srl_errors.TaskError(f"example_id {eid} out of range [0, {len(self.tasks)})")
            return {"text": demonstration(self.tasks[eid], str(req["key"]))}
        if op == "run_trace":
            if self.trace_env is None or channel is None:
                raise srl_errors.HarnessError("run_trace: this env runs srl's plain chat loop (op start)")
            eid = str(req["episode"])
            run = asyncio.ensure_future(
                self.trace_env.run(int(req["example_id"]), eid, dict(req["sampling"]), channel.call)
            )
            self.trace_runs[eid] = run
            try:
                return await run
            except asyncio.CancelledError:
                raise srl_errors.HarnessError(f"episode {eid} cancelled by the orchestrator") from None
            finally:
                self.trace_runs.pop(eid, None)
        if op == "cancel":  # the orchestrator gave up on a trace episode (its rollout timeout)
            run = self.trace_runs.get(str(req.get("episode")))
            if run is not None:
                run.cancel()
            return {"cancelled": run is not None}
        if op == "start":
            return await self._start(int(req["example_id"]), req["episode"])
        if op == "start_group":
            # The episodes of one group in one request (one round trip instead of one per rollout); each episode
            # succeeds or fails on its own, like separate starts.
            ids = list(req["episodes"])
            outcomes = await asyncio.gather(
                *(self._start(int(req["example_id"]), e) for e in ids), return_exceptions=True
            )
            return {"results": [outcome(o) for o in outcomes]}
        episode = self.episodes.get(req.get("episode", ""))
        if op == "close":
            dropped = self.episodes.pop(req.get("episode", ""), None)
            if dropped is not None:
                await dropped.close()
            return {}
        if episode is None:
            raise srl_errors.HarnessError(f"unknown episode {req.get('episode')!r}")
        if op == "step":
            messages, done = await episode.step(req["reply"])
            out: dict[str, Any] = {"messages": messages, "done": done}
            if done and req.get("finish"):  # the client asked for the score with the last step (one round trip)
                out["scored"] = outcome(await settled(self._finish(req["episode"], episode)))
            return out
        if op == "finish":
            return await self._finish(req["episode"], episode)
        raise srl_errors.HarnessError(f"unknown op {op!r}")

    async def _start(self, example_id: int, episode_id: str) -> dict[str, Any]:
        """Run the setup of a new episode of task ``example_id``. Result: ``task_id``, first ``messages`` and
        ``single_turn`` (the task has no ``user_turn``: its first step ends it). Raises TaskError."""
        if not 0 <= example_id < len(self.tasks):
            raise srl_errors.TaskError(f"example_id {example_id} out of range [0, {len(self.tasks)})")
        task = self.tasks[example_id]
        episode = Episode(task, max_turns=self.max_turns, runtime_config=self.runtime_config)
        try:
            messages = await self._staged("setup", episode.start())
        except BaseException:
            await episode.close()
            raise
        self.episodes[episode_id] = episode
        return {"task_id": task_identity(task), "messages": messages, "single_turn": not episode.multi_turn}

    async def _finish(self, episode_id: str, episode: Episode) -> dict[str, Any]:
        """Finalize and score an episode (each stage under its timeout) and forget it. Raises TaskError."""
        try:
            await self._staged("finalize", episode.finalize())
            scored = await self._staged("scoring", episode.score())
        finally:
            self.episodes.pop(episode_id, None)
            await episode.close()
        return {**scored, "wants_more": episode.wants_more}

    async def respond(
        self,
        req: dict[str, Any],
        writer: asyncio.StreamWriter,
        outbox: list[bytes],
        channel: CallbackChannel | None = None,
    ) -> None:
        out = {"id": req.get("id"), **outcome(await settled(self.handle(req.get("op", ""), req, channel)))}
        if not writer.is_closing():
            coalesce_writes(asyncio.get_running_loop(), writer, outbox, encode(out))
            await writer.drain()

    async def serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        running: set[asyncio.Task] = set()
        outbox: list[bytes] = []  # responses of one loop iteration, sent together
        channel = CallbackChannel(writer, outbox)
        try:
            while line := await reader.readline():
                msg = json.loads(line)
                if "cb" in msg and "op" not in msg:  # the orchestrator's answer to a callback
                    channel.resolve(msg)
                    continue
                task = asyncio.create_task(self.respond(msg, writer, outbox, channel))
                running.add(task)
                task.add_done_callback(running.discard)
        except (OSError, ConnectionError, ValueError):
            pass
        finally:
            channel.fail_all("the orchestrator's connection closed")
            writer.close()


async def _watch_parent(parent_pid: int) -> None:
    while True:
        await asyncio.sleep(1.0)
        if os.getppid() != parent_pid:
            end_descendants(GRACE_S)  # harness programs and tool servers of live episodes go too
            os._exit(0)  # the orchestrator is gone: do not linger as an orphan


async def serve(spec: dict[str, Any], host: str, port: int, parent_pid: int | None) -> None:
    """Load the tasks, listen, announce the address on stdout and serve until SIGTERM (then stop verifiers'
    servers and every program the episodes started)."""
    worker = EnvWorker(spec)
    stop = asyncio.Event()
    # Before verifiers' shared servers start, so a SIGTERM during their start-up still ends them (below).
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    if worker.trace_env is not None:
        await worker.trace_env.start()
        print(
            f"env '{worker.trace_env.name}' runs through verifiers' own rollout: " + "; ".join(worker.reasons),
            file=sys.stderr,
            flush=True,
        )
    sigcache.install()  # verifiers' scoring asks for the same signatures on every rollout (see sigcache)
    # verifiers' modules and the loaded tasks live as long as the worker: moved out of the collector's view, so
    # the collections that episodes' short-lived objects trigger do not walk them again and again (measured: env
    # worker CPU per episode -15%, orchestrator_overhead 267-275 -> 350-380 rollouts/s in interleaved runs).
    gc.collect()
    gc.freeze()
    server = await asyncio.start_server(worker.serve_connection, host, port, limit=STREAM_LIMIT)
    bound_host, bound_port = server.sockets[0].getsockname()[:2]
    print(f"{READY_PREFIX} {bound_host}:{bound_port}", flush=True)
    watcher = asyncio.create_task(_watch_parent(parent_pid)) if parent_pid else None
    try:
        async with server:
            await stop.wait()
    finally:
        if watcher is not None:
            watcher.cancel()
        if worker.trace_env is not None:
            with contextlib.suppress(Exception):  # a server that will not stop: its processes are ended below
                await asyncio.wait_for(worker.trace_env.aclose(), GRACE_S)
        end_descendants(GRACE_S)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True, help="JSON file with the env spec, or '-' for stdin")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--parent-pid", type=int, default=None)
    args = parser.parse_args(argv)
    # The supervisor's watchdog asks a stuck orchestrator's env workers for their stacks too (the orchestrator lists
    # their pids in its progress record); stderr is drained into the orchestrator's log.
    enable_stack_dumps()
    text = sys.stdin.read() if args.spec == "-" else Path(args.spec).read_text()
    asyncio.run(serve(json.loads(text), args.host, args.port, args.parent_pid))


if __name__ == "__main__":
    main()
