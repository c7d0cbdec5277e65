"""ASGI middleware loaded into every vLLM engine: admin routes need the run's admin token.

It also wraps ``versions.WeightVersionTag`` (which weight versions the engine serves; completions are tagged with
them). Loaded with ``--middleware toolkit.inference.guard.AdminGuard`` (``commands.engine_command`` adds it; vLLM 0.32
imports the path and calls ``app.add_middleware(AdminGuard)``, which makes it the outermost layer, so it runs before
routing, vLLM's own ``--api-key`` check and CORS). Pure ASGI without third-party imports: it is importable anywhere.

Why: engines run with ``VLLM_SERVER_DEV_MODE=1`` (live reload needs ``/collective_rpc``, ``/pause``, ...), and
vllm-router 0.1.17 forwards *every* path to a worker, while vLLM's ``--api-key`` guards only ``/v1``-prefixed paths.

Rule: a request whose path is in :data:`OPEN_PATHS` (or under ``/metrics/``) passes untouched. Every other path —
any method, HTTP or WebSocket — needs header ``X-SRL-Admin-Token`` equal to ``SRL_ADMIN_TOKEN`` from the engine's
environment (compared with ``hmac.compare_digest``). Otherwise the answer is JSON with status 401 (header missing or
wrong) or 403 (the engine has no token: admin routes are off, fail closed). The token is never echoed.

The open list is an allow-list, not a deny-list, so a route a future vLLM adds is guarded until someone decides
otherwise. It holds what clients of an RL deployment need, each read-only with respect to the engine's state:

- ``/health``, ``/ping``, ``/version``: liveness (srl's readiness wait, the router's health checks);
- ``/metrics`` (Prometheus mount): queue depths for ``srl inference queues`` and monitoring;
- ``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``, ``/v1/responses``, ``/v1/embeddings``: the OpenAI
  API that rollouts, evals and verifiers harnesses call (srl's PolicyClient uses ``/v1/completions``);
- ``/tokenize``, ``/detokenize``: pure functions of the served tokenizer.

Guarded, among others: the dev routes (``/collective_rpc``, ``/pause``, ``/resume``, ``/reset_prefix_cache``,
``/sleep``, ``/wake_up``, ``/server_info``, ...), the RL routes (``/update_weights``, ``/update_weight_version``,
``/weight_info``, ``/abort_requests``, ...), ``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` (``/v1``
paths that load files from the engine host), profiling, ``/inference/v1/generate`` (not used by srl), the render
endpoints and the OpenAPI docs. Paths are matched exactly after removing ``root_path``: ``/v1/completions/`` or
``/v1/../pause`` are not open.
"""

from __future__ import annotations

import hmac
import json
from typing import Any

from toolkit.engines.admin_token import ADMIN_TOKEN_ENV, ADMIN_TOKEN_HEADER, admin_token_from_env
from toolkit.inference.quickpause import QuickPause
from toolkit.inference.versions import WeightVersionTag, route_path

OPEN_PATHS = frozenset(
    {
        "/health",
        "/ping",
        "/version",
        "/metrics",
        "/v1/models",
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/responses",
        "/v1/embeddings",
        "/tokenize",
        "/detokenize",
    }
)
OPEN_PREFIXES = ("/metrics/",)  # the Prometheus app is mounted at /metrics and may redirect to /metrics/
_HEADER_KEY = ADMIN_TOKEN_HEADER.lower().encode("latin-1")  # ASGI header names are lower-case bytes


def is_open(path: str) -> bool:
    """True when ``path`` (the URL path without query string) may be called without the admin token."""
    return path in OPEN_PATHS or path.startswith(OPEN_PREFIXES)


class AdminGuard:
    """Pure ASGI middleware guarding every non-open route with the run's admin token (see module docstring).

    ``app`` is the wrapped ASGI app. ``token`` defaults to ``SRL_ADMIN_TOKEN`` from the environment at
    construction (vLLM constructs the middleware once, at server start); None or "" disables admin routes.
    """

    def __init__(self, app: Any, token: str | None = None) -> None:
        # The weight-version record sits just inside the guard: it sees only the loads the guard admitted; the
        # quick pause inside both (toolkit.inference.quickpause).
        self.app = WeightVersionTag(QuickPause(app))
        token = admin_token_from_env() if token is None else token
        self._token = token.encode() if token else None

    def __repr__(self) -> str:  # never show the token
        return f"AdminGuard(enabled={self._token is not None})"

    def check(self, path: str, supplied: bytes | None) -> tuple[int, str] | None:
        """None when a request for ``path`` with header value ``supplied`` may pass, else ``(status, reason)``."""
        if is_open(path):
            return None
        if self._token is None:
            return 403, (
                f"admin route {path} is disabled: this engine was started without {ADMIN_TOKEN_ENV} "
                "(srl's launchers set it)"
            )
        if supplied is None:
            return 401, f"admin route {path} needs the run's admin token in header {ADMIN_TOKEN_HEADER}"
        if not hmac.compare_digest(supplied, self._token):
            return 401, f"admin route {path}: the {ADMIN_TOKEN_HEADER} header does not match this run's token"
        return None

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):  # lifespan events
            await self.app(scope, receive, send)
            return
        path = route_path(scope)
        supplied = next((v for k, v in scope.get("headers") or () if k == _HEADER_KEY), None)
        refusal = self.check(path, supplied)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        status, reason = refusal
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008, "reason": reason[:120]})  # policy violation
            return
        body = json.dumps({"error": {"message": reason, "type": "srl_admin_guard", "code": status}}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", ADMIN_TOKEN_HEADER.encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
