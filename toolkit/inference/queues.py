"""Queue depths of a deployment's engines, per role, from vLLM's Prometheus ``/metrics``.

``srl inference queues <run>`` prints these so a user can see which side of a prefill/decode deployment to grow:
requests piling up in the prefill engines' waiting queues mean too few prefill replicas, and vice versa.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import httpx

from toolkit.engines.metrics import RUNNING, WAITING, parse_metric

if TYPE_CHECKING:
    from toolkit.run.layout import RunDir


# What engine_queue reports -> vLLM's metric name.
_METRICS = {
    "waiting": WAITING,
    "running": RUNNING,
    "kv_cache_usage": "vllm:kv_cache_usage_perc",
}


def engine_queue(url: str, *, timeout_s: float = 5.0) -> dict[str, float | None]:
    """``waiting`` and ``running`` request counts and ``kv_cache_usage`` (0-1) of one engine.

    Values are None when the engine is unreachable or does not export the metric; ``error`` then says why.
    """
    try:
        resp = httpx.get(f"{url.rstrip('/')}/metrics", timeout=timeout_s)
        resp.raise_for_status()
    except httpx.HTTPError as exc:
        return {**dict.fromkeys(_METRICS), "error": f"{type(exc).__name__}: {exc}"}
    return {key: parse_metric(resp.text, name) for key, name in _METRICS.items()}


def queue_depths(engine_urls_by_role: Mapping[str, Sequence[str]], *, timeout_s: float = 5.0) -> dict[str, Any]:
    """Queue depths of every engine, grouped by role ("engine", "prefill", "decode").

    Returns ``{role: {"engines": {url: engine_queue(url)}, "waiting": total, "running": total}}`` (totals over
    reachable engines) plus, when both prefill and decode are present, ``"advice"``: which side to grow (the side
    whose waiting requests per engine are higher; "balanced" when neither waits).
    """
    out: dict[str, Any] = {}
    for role, urls in engine_urls_by_role.items():
        engines = {u: engine_queue(u, timeout_s=timeout_s) for u in urls}
        out[role] = {
            "engines": engines,
            "waiting": sum(e["waiting"] or 0.0 for e in engines.values()),
            "running": sum(e["running"] or 0.0 for e in engines.values()),
        }
    if "prefill" in out and "decode" in out:
        per = {r: out[r]["waiting"] / max(1, len(out[r]["engines"])) for r in ("prefill", "decode")}
        if per["prefill"] == per["decode"] == 0:
            out["advice"] = "balanced: no requests waiting on either side"
        else:
            side = "prefill" if per["prefill"] > per["decode"] else "decode"
            out["advice"] = (
                f"grow {side}: {per[side]:.1f} requests waiting per {side} engine "
                f"(prefill {per['prefill']:.1f}, decode {per['decode']:.1f})"
            )
    return out


def run_queue_depths(run: RunDir, *, timeout_s: float = 5.0) -> dict[str, Any]:
    """``srl inference queues <run>``: queue depths of the engines listed in the run's readiness file.

    ``run`` is a ``RunDir``. Raises FileNotFoundError when the deployment has not reported ready, ValueError naming
    the file when it is not a readiness record (torn, overwritten, another program's file).
    """
    path = run.inference_ready
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:  # bad JSON or bytes that are not UTF-8
        raise ValueError(f"{path} is not a readiness record ({e})") from None
    urls = info.get("engine_urls") if isinstance(info, dict) else None
    roles = info.get("roles") if isinstance(info, dict) else None
    if not (isinstance(urls, list) and all(isinstance(u, str) for u in urls)) or not isinstance(roles or {}, dict):
        raise ValueError(
            f"{path} is not a readiness record (it needs engine_urls, a list of URLs); the deployment "
            "rewrites it when it next starts"
        )
    by_role: dict[str, list[str]] = {}
    for url in urls:
        by_role.setdefault(str((roles or {}).get(url, "engine")), []).append(url)
    return queue_depths(by_role, timeout_s=timeout_s)
