"""The env worker wire protocol: newline-delimited JSON over TCP, requests multiplexed by id.

Request  ``{"id": n, "op": "health" | "info" | "start" | "start_group" | "step" | "finish" | "close", ...params}``
Response ``{"id": n, "ok": true, "result": {...}}`` or ``{"id": n, "ok": false, "error_class": C, "error": msg}``
where C is one of srl's error classes (``toolkit.errors``). A lost connection means the worker died: the
client raises ``SandboxError`` (transient, retried by the runtime), the env-server analogue of a lost sandbox.

Callbacks (worker -> orchestrator, same connection): an episode that verifiers runs in the worker (``run_trace``)
asks the orchestrator for each model turn: ``{"cb": n, "op": "generate", "episode": E, "prompt_ids", "sampling",
"session_id"}``, answered ``{"cb": n, "ok": true, "result": {"token_ids", "logprobs", "finish_reason",
"policy_version", "foreign_version"}}`` (or an error outcome). The orchestrator keeps the model call (its policy
client: retries, the serving gate during engine restarts, policy versions); the worker keeps the episode. A
message with ``cb`` is a callback, one with ``id`` a request of the orchestrator's or its response.

Round trips per rollout: ``start_group`` starts every episode of a group in one request (``results``: one
``{"ok", "result" | "error_class", "error"}`` per episode, in order), and a ``step`` sent with ``"finish": true``
that ends the episode also carries its score (``scored``, same shape), so a single-turn rollout needs one request
of its own instead of three.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from typing import Any

from toolkit import errors as srl_errors

STREAM_LIMIT = 64 * 1024 * 1024  # bytes per line: long multi-turn conversations travel as one JSON line
READY_PREFIX = "SRL_ENV_WORKER_READY"
"""A worker's first stdout line: ``SRL_ENV_WORKER_READY host:port``. Here, not in ``server``, so the orchestrator
(``runtime``) reads it without importing the worker's modules (verifiers, and torch through it: seconds of CPU)."""


def encode(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


def unwrap(outcome: dict[str, Any]) -> Any:
    """The ``result`` of a wire outcome (``{"ok": true, "result"}``). Raises the srl exception of a failed one
    (``{"ok": false, "error_class", "error"}``); an unknown class becomes HarnessError (the env server's code)."""
    if outcome.get("ok"):
        return outcome.get("result")
    raise error_class(outcome.get("error_class", "HarnessError"))(outcome.get("error", ""))


def error_class(name: str) -> type[srl_errors.SrlRolloutError]:
    """srl's error class called ``name`` (``toolkit.errors``); an unknown name is HarnessError (the failing side's
    own code)."""
    klass = getattr(srl_errors, name, None)
    if not (isinstance(klass, type) and issubclass(klass, srl_errors.SrlRolloutError)):
        klass = srl_errors.HarnessError
    return klass


def outcome(value: Any) -> dict[str, Any]:
    """A result or an exception as the wire sees it: ``{"ok": true, "result"}`` or ``{"ok": false, "error_class",
    "error"}``; an exception that is not an srl error class is a bug on the answering side: HarnessError."""
    if isinstance(value, srl_errors.SrlRolloutError):
        return {"ok": False, "error_class": value.error_class, "error": str(value)}
    if isinstance(value, BaseException):
        return {"ok": False, "error_class": "HarnessError", "error": f"{type(value).__name__}: {value}"}
    return {"ok": True, "result": value}


async def settled(coro: Any) -> Any:
    """The result of ``coro``, or the exception it raised (returned, not raised)."""
    try:
        return await coro
    except Exception as exc:  # noqa: BLE001 - every failure is reported to the peer by outcome()
        return exc


class CallbackChannel:
    """The worker's end of callbacks (see the module docstring): requests it sends to the orchestrator over the
    connection a request came in on, answered by id ``cb``. One per connection."""

    def __init__(self, writer: asyncio.StreamWriter, outbox: list[bytes]) -> None:
        self.writer, self.outbox = writer, outbox
        self._pending: dict[int, asyncio.Future] = {}
        self._ids = itertools.count()

    async def call(self, op: str, **params: Any) -> Any:
        """Send callback ``op`` and wait for its answer. Raises the orchestrator's error class, or ProviderError
        when the connection is gone (the orchestrator, owner of the model call, cannot answer)."""
        if self.writer.is_closing():
            raise srl_errors.ProviderError("the orchestrator's connection is closed: no model call possible")
        cid = next(self._ids)
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._pending[cid] = fut
        try:
            coalesce_writes(loop, self.writer, self.outbox, encode({"cb": cid, "op": op, **params}))
            await self.writer.drain()
            msg = await fut
        except (OSError, ConnectionError) as exc:
            raise srl_errors.ProviderError(f"the orchestrator's connection failed: {exc}") from exc
        finally:
            self._pending.pop(cid, None)
        return unwrap(msg)

    def resolve(self, msg: dict[str, Any]) -> None:
        """Deliver an answer (a message with ``cb`` and no ``op``)."""
        fut = self._pending.pop(msg.get("cb"), None)
        if fut is not None and not fut.done():
            fut.set_result(msg)

    def fail_all(self, why: str) -> None:
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(srl_errors.ProviderError(why))
        self._pending.clear()


def coalesce_writes(
    loop: asyncio.AbstractEventLoop, writer: asyncio.StreamWriter, outbox: list[bytes], data: bytes
) -> None:
    """Queue ``data`` on ``outbox`` and send everything queued in one write at the end of this loop iteration.

    Many rollouts reach the same stage in the same iteration (a group starts together, completions arrive in
    bursts); one ``send`` for all their messages instead of one each saves a system call per message, which was
    the largest single cost of the env worker protocol on both ends. Order is kept (one outbox per connection).
    """
    outbox.append(data)
    if len(outbox) == 1:
        loop.call_soon(_flush, writer, outbox)


def _flush(writer: asyncio.StreamWriter, outbox: list[bytes]) -> None:
    data = b"".join(outbox)
    outbox.clear()
    if not writer.is_closing():
        writer.write(data)


class WorkerConnection:
    """One client connection to an env worker at ``host:port``; safe for many concurrent ``call``s."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._pending: dict[int, asyncio.Future] = {}
        self._ids = itertools.count()
        self._reader_task: asyncio.Task | None = None
        self.closed = False
        self._outbox: list[bytes] = []  # requests of this loop iteration, sent together (coalesce_writes)
        self.callbacks: dict[str, Any] = {}
        """Episode id -> ``async handler(op, params) -> result`` for the worker's callbacks of that episode."""
        self._answering: set[asyncio.Task] = set()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def inflight(self) -> int:
        return len(self._pending)

    async def connect(self, timeout: float = 10.0) -> None:
        """Open the connection. Raises SandboxError when the worker cannot be reached within ``timeout`` s."""
        try:
            self._reader, self._writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port, limit=STREAM_LIMIT), timeout
            )
        except (TimeoutError, OSError) as exc:
            raise srl_errors.SandboxError(f"env worker {self.address} unreachable: {exc}") from exc
        self._reader_task = asyncio.create_task(self._read_loop())

    async def _read_loop(self) -> None:
        assert self._reader is not None
        try:
            while line := await self._reader.readline():
                msg = json.loads(line)
                if "cb" in msg:
                    task = asyncio.create_task(self._answer(msg))
                    self._answering.add(task)
                    task.add_done_callback(self._answering.discard)
                    continue
                fut = self._pending.pop(msg.get("id"), None)
                if fut is not None and not fut.done():
                    fut.set_result(msg)
        except (OSError, ValueError, asyncio.IncompleteReadError):
            pass
        finally:
            self._fail_all(f"env worker {self.address} connection lost")

    async def _answer(self, msg: dict[str, Any]) -> None:
        """Answer one worker callback with the handler registered for its episode."""
        handler = self.callbacks.get(str(msg.get("episode")))
        if handler is None:
            result: Any = srl_errors.HarnessError(f"callback for unknown episode {msg.get('episode')!r}")
        else:
            params = {k: v for k, v in msg.items() if k not in ("cb", "op", "episode")}
            result = await settled(handler(msg.get("op"), params))
        if self._writer is not None and not self._writer.is_closing():
            coalesce_writes(
                asyncio.get_running_loop(), self._writer, self._outbox, encode({"cb": msg.get("cb"), **outcome(result)})
            )
            with contextlib.suppress(OSError, ConnectionError):
                await self._writer.drain()

    def _fail_all(self, why: str) -> None:
        self.closed = True
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(srl_errors.SandboxError(why))
        self._pending.clear()

    async def call(self, op: str, timeout: float | None = None, **params: Any) -> dict[str, Any]:
        """Send one request and wait for its result (at most ``timeout`` s; None waits forever).

        Raises the worker's error class, SandboxError when the connection is lost, asyncio.TimeoutError on
        ``timeout``.
        """
        if self.closed or self._writer is None:
            raise srl_errors.SandboxError(f"env worker {self.address} connection lost")
        rid = next(self._ids)
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._pending[rid] = fut
        try:
            coalesce_writes(loop, self._writer, self._outbox, encode({"id": rid, "op": op, **params}))
            await self._writer.drain()
            msg = await (fut if timeout is None else asyncio.wait_for(asyncio.shield(fut), timeout))
        except TimeoutError:
            raise  # a subclass of OSError on Python >= 3.11: must not be read as a lost connection
        except (OSError, ConnectionError) as exc:
            raise srl_errors.SandboxError(f"env worker {self.address}: {exc}") from exc
        finally:
            self._pending.pop(rid, None)
        return unwrap(msg) or {}

    async def close(self) -> None:
        """Close the connection (idempotent)."""
        self.closed = True
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(OSError, ConnectionError):
                await self._writer.wait_closed()
        for task in list(self._answering):
            task.cancel()
        if self._reader_task is not None:
            self._reader_task.cancel()
            # already torn down: nothing to report
            with contextlib.suppress(asyncio.CancelledError, OSError, ConnectionError):
                await self._reader_task
