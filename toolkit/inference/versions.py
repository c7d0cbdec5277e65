"""Weight versions that name their owner, and the engine-side record of them (pure, no third-party imports).

Why: a bare step number cannot tell version 3 of run A from version 3 of run B, so two runs loading weights into one
engine each trained on rollouts of the other's policy without a warning. Every version srl loads is therefore
``"<run id>:<step>"`` (:func:`format_version`), and every completion says which versions produced it.

What the engine reports, and where:

- ``/update_weight_version`` (vLLM's own route; a full-weight load sets it while the engines are paused) and
  vLLM's ``/weight_info``: the version of the engine's base weights. vLLM starts at ``"default"`` (never reloaded).
- a LoRA load (``/v1/load_lora_adapter``) carries its version in header ``X-SRL-Weight-Version``; the adapter's
  name carries the run id too (:func:`lora_name`), so LoRA runs that share an engine each load only their own
  adapter and never touch the base weights' version.
- every completion answer (``/v1/completions``, ``/v1/chat/completions``) gets two headers: ``X-SRL-Weight-Version``,
  the base weights' versions between the request's arrival and its answer (comma-separated, oldest first: one
  unless a load happened meanwhile), and, for a request naming a loaded adapter, ``X-SRL-Adapter-Version``, the
  same for that adapter. A streamed answer's headers go out when it starts, so they name the versions up to then.
  Behind vllm-router or an engine without this middleware the headers may be missing: the orchestrator then
  falls back to the version it believes is served.
- ``GET /srl/weight_versions`` (an admin route): ``{"base": version, "adapters": {name: version}}``.

:class:`WeightVersionTag` keeps that record; it is the ASGI middleware just inside ``guard.AdminGuard`` (which wraps
it), so only loads the guard admitted reach it, and a load is recorded only when the engine answered 2xx. One
record per API server process: srl runs one API server per engine, and a restarted engine starts a fresh record
just as vLLM starts again at ``"default"``.

:func:`judge` is the orchestrator's side: from what the engine reported, the policy version a completion was
sampled with and, if any of its tokens came from another run's weights, which version that was.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

VERSION_HEADER = "X-SRL-Weight-Version"
ADAPTER_VERSION_HEADER = "X-SRL-Adapter-Version"
VERSIONS_PATH = "/srl/weight_versions"
# Base-weight versions that mean "the deployment's own base model": vLLM's initial value (never reloaded), and
# what a run writes after loading the base model back into a deployment another run had changed.
BASE_VERSIONS = frozenset({"default", "base"})
LORA_PREFIX = "srl-lora-"
_COMPLETION_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})
_HISTORY = 64  # versions kept per key: a request spanning more loads than this is reported as unknown ("?")


def format_version(run_id: str | None, step: int) -> str:
    """The version string of policy ``step`` of run ``run_id``: ``"<run id>:<step>"`` (``"<step>"`` without a run
    id: tools and benchmarks that load weights outside any run)."""
    return f"{run_id}:{int(step)}" if run_id else str(int(step))


def parse_version(version: str) -> tuple[str | None, int] | None:
    """``(run id, step)`` of a version string (run id None for a bare step), or None when it is not one srl wrote
    (``"default"``, ``"base"``, anything else)."""
    owner, sep, step = version.rpartition(":")
    if not step.isdigit():
        return None
    return (owner if sep else None), int(step)


def lora_name(run_id: str) -> str:
    """The name run ``run_id``'s adapter is served under (requests name it as their model)."""
    return f"{LORA_PREFIX}{run_id}"


def split_header(value: str | None) -> list[str]:
    """The versions listed in a version header (empty for a missing or empty header)."""
    return [v for v in (value or "").split(",") if v]


@dataclass(frozen=True)
class Verdict:
    """What a completion was sampled with, for one run: ``version`` is the oldest of the run's own policy versions
    that produced it (0 for the base model); ``foreign`` the first reported version that is not this run's (None
    when every token came from this run's weights)."""

    version: int
    foreign: str | None = None


def judge(
    run_id: str | None, believed: int, base: Iterable[str], adapter: Iterable[str] | None = None, *, lora: bool = False
) -> Verdict:
    """Judge one completion of run ``run_id`` from the versions its engine reported.

    ``base``: the engine's base-weight versions while it sampled (header ``X-SRL-Weight-Version``); ``adapter``: its
    adapter's (``X-SRL-Adapter-Version``, None when the request named no adapter); ``lora``: the run trains an
    adapter (its base weights must stay the deployment's base model). ``believed``: the version the run believes is
    served, used when the engine reported nothing (an engine without srl's middleware) or, with ``run_id`` None,
    always. A LoRA run's request before its first adapter load names the base model: version 0.
    """
    base = list(base)
    if run_id is None or (not base and adapter is None):
        return Verdict(believed)
    steps: list[int] = []
    for v in base:
        if v in BASE_VERSIONS:
            steps.append(0)
            continue
        parsed = parse_version(v)
        if lora or parsed is None or parsed[0] != run_id:
            return Verdict(believed, foreign=v)
        steps.append(parsed[1])
    if lora:
        steps = [0]
        for v in adapter or ():
            parsed = parse_version(v)
            if parsed is None or parsed[0] != run_id:
                return Verdict(believed, foreign=f"adapter {v}")
        if adapter:
            steps = [p[1] for v in adapter if (p := parse_version(v)) is not None]
    return Verdict(min(steps) if steps else believed)


def route_path(scope: dict) -> str:
    """The route an ASGI request asks for: ``scope["path"]`` without the app's ``root_path`` prefix (a server
    mounted under a prefix still routes ``/v1/completions``)."""
    path = scope["path"]
    root = scope.get("root_path") or ""
    if root and path.startswith(root):
        path = path[len(root) :] or "/"
    return path


class _Book:
    """Versions per key (None: the base weights; a name: that adapter), each with the sequence number of its load,
    so a request can list every version set between its arrival and its answer."""

    def __init__(self) -> None:
        self.seq = 0
        self.history: dict[str | None, list[tuple[int, str]]] = {None: [(0, "default")]}

    def set(self, key: str | None, version: str) -> None:
        self.seq += 1
        h = self.history.setdefault(key, [])
        h.append((self.seq, version))
        del h[:-_HISTORY]

    def since(self, key: str | None, seq: int) -> list[str]:
        """The version current at sequence number ``seq`` and every one set after it (["?"] when some were
        forgotten)."""
        h = self.history.get(key)
        if not h:
            return []
        first = next((i for i in range(len(h) - 1, -1, -1) if h[i][0] <= seq), None)
        if first is None:  # the version current at seq was trimmed off (more than _HISTORY loads meanwhile)
            return ["?"] + [v for _, v in h]
        return [v for _, v in h[first:]]


async def _read_body(receive: Any) -> tuple[bytes, list[dict]]:
    """Read a whole request body; returns it and the messages read (to be replayed to the app)."""
    messages, chunks = [], []
    while True:
        msg = await receive()
        messages.append(msg)
        if msg["type"] != "http.request":
            break
        chunks.append(msg.get("body", b""))
        if not msg.get("more_body"):
            break
    return b"".join(chunks), messages


def _json(body: bytes) -> dict:
    try:
        data = json.loads(body) if body else {}
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


class WeightVersionTag:
    """Pure ASGI middleware: records which weight versions an engine serves and tags every completion with them
    (module docstring). ``app`` is the wrapped ASGI app."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.book = _Book()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        path = route_path(scope) if scope["type"] == "http" else None
        if path == VERSIONS_PATH and scope.get("method") == "GET":
            await self._answer_versions(send)
            return
        if scope.get("method") != "POST" or path not in (
            *_COMPLETION_PATHS,
            "/update_weight_version",
            "/v1/load_lora_adapter",
            "/v1/unload_lora_adapter",
        ):
            await self.app(scope, receive, send)
            return
        body, messages = await _read_body(receive)
        replay = list(messages)

        async def receive_again() -> dict:
            return replay.pop(0) if replay else await receive()

        data = _json(body)
        if path in _COMPLETION_PATHS:
            await self._completion(scope, data, receive_again, send)
            return
        headers = dict(scope.get("headers") or ())
        status: list[int] = []

        async def send_noting(msg: dict) -> None:
            if msg["type"] == "http.response.start":
                status.append(int(msg["status"]))
            await send(msg)

        await self.app(scope, receive_again, send_noting)
        if not status or not 200 <= status[0] < 300:
            return
        if path == "/update_weight_version" and isinstance(data.get("new_version"), str):
            self.book.set(None, data["new_version"])
        elif path == "/v1/load_lora_adapter" and isinstance(data.get("lora_name"), str):
            given = headers.get(VERSION_HEADER.lower().encode("latin-1"), b"").decode("latin-1")
            self.book.set(data["lora_name"], given or "unversioned")
        elif path == "/v1/unload_lora_adapter" and isinstance(data.get("lora_name"), str):
            self.book.history.pop(data["lora_name"], None)

    async def _completion(self, scope: dict, data: dict, receive: Any, send: Any) -> None:
        model = data.get("model")
        adapter = model if isinstance(model, str) and model in self.book.history else None
        seq = self.book.seq

        async def send_tagged(msg: dict) -> None:
            if msg["type"] == "http.response.start":
                extra = [(VERSION_HEADER.lower().encode(), ",".join(self.book.since(None, seq)).encode("latin-1"))]
                if adapter is not None:
                    extra.append(
                        (
                            ADAPTER_VERSION_HEADER.lower().encode(),
                            ",".join(self.book.since(adapter, seq)).encode("latin-1"),
                        )
                    )
                msg = {**msg, "headers": [*msg.get("headers", []), *extra]}
            await send(msg)

        await self.app(scope, receive, send_tagged)

    async def _answer_versions(self, send: Any) -> None:
        current = {k: h[-1][1] for k, h in self.book.history.items() if h}
        body = json.dumps({"base": current.pop(None, None), "adapters": current}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})
