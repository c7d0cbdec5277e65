"""Reading an engine's Prometheus ``/metrics`` text (vLLM's counters and gauges: queue depths, generated tokens,
cache hits). Pure: the callers fetch the text."""

from __future__ import annotations

import re

# vLLM's gauges of the requests an engine holds: being generated, and queued for it.
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"

# One sample line of the Prometheus text format: name{labels} value
_SAMPLE_RE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")


def parse_metric(text: str, name: str) -> float | None:
    """Sum of every sample of metric ``name`` (over label sets, e.g. DP ranks) in Prometheus text; None if absent."""
    total, seen = 0.0, False
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        m = _SAMPLE_RE.match(line)
        if m and m.group("name") == name:
            total += float(m.group("value"))
            seen = True
    return total if seen else None
