"""Elastic inference: replicas that join a running run on their own Slurm jobs, and leave it at any time.

A replica is an ``srl inference`` deployment of the run's model submitted by ``srl inference join RUN`` into
``<run>/replicas/replica-<n>/``; when its engine answers, it publishes its readiness file there like any
deployment. The orchestrator owns the policy, so it, not the replica, decides when a replica may serve:

1. **join**: every ``poll_s`` seconds the pool reads the replicas' readiness files. A replica whose engines answer
   ``/health`` gets the policy version the run serves now, loaded under the policy tracker's lock (so no weight
   update runs meanwhile; version 0 is the base model it started with), then is included in every later weight
   update (``WeightUpdater.add_engine``, with the replica's own admin token) and only then added to the run's
   router (``POST /add_worker``): no rollout ever reaches it before it holds the run's weights.
2. **leave**: a joined engine that refuses connections (its job ended: time limit, preemption, scancel, node
   failure) is removed from the router first, then from the updates. Requests it held fail there and are sent
   again to the others: by vllm-router itself, which retries a failed request on another worker, or by the
   policy client (``inference/retried_requests``); no step waits on it. How many it held is counted from its own
   ``/metrics`` (running + waiting requests) read at each round while it serves, so the count is the last one
   seen, at most ``poll_s`` before it went away (``requests_held`` in its leave event;
   ``inference/lost_requests`` in the metrics).
3. **rejoin**: a replica job that Slurm requeues starts a new engine and rewrites its readiness file (a newer
   ``written_at``): it joins again through step 1.

Events go to ``<run>/replicas/events.jsonl``, one JSON line each: ``{"event": "join" | "leave", "url", "replica",
"version", "time", "why"}``, a leave with ``requests_held``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any

import httpx

from toolkit import fsutil
from toolkit.engines.admin_token import read_token_file
from toolkit.engines.health import current_ready
from toolkit.engines.metrics import RUNNING, WAITING, parse_metric
from toolkit.inference.weights import WeightUpdater
from toolkit.orchestrator.engines import poll_until, probe_engine
from toolkit.run.layout import RunDir

log = logging.getLogger(__name__)

POLL_S = 2.0
PROBE_TIMEOUT_S = 5.0
# vllm-router's /add_worker answers once the worker passed its health check: seconds on loaded cores.
ROUTER_ADD_TIMEOUT_S = 60.0


@dataclass
class Joined:
    """A replica engine in the run: its deployment directory and the readiness it joined with (``written_at``)."""

    replica: RunDir
    written_at: float


class ReplicaPool:
    """Joins and removes elastic replicas (module doc). ``tracker``: the ``PolicyTracker`` (``lock``,
    ``served_version``, ``updater``, ``update_weights``); ``router_url``: the run's router; ``run_id``: the run's
    id, which every weight version it loads carries; ``reload_timeout_s``: bound of loading the policy into a
    joining replica, seconds."""

    def __init__(
        self,
        run: RunDir,
        tracker: Any,
        router_url: str,
        *,
        run_id: str,
        reload_timeout_s: float = 300.0,
        poll_s: float = POLL_S,
    ) -> None:
        self.run = run
        self.tracker = tracker
        self.router_url = router_url.rstrip("/")
        self.run_id = run_id
        self.reload_timeout_s = reload_timeout_s
        self.poll_s = poll_s
        self.joined: dict[str, Joined] = {}  # engine URL -> how it joined
        self.held: dict[str, int] = {}  # engine URL -> requests it held when last seen
        self.joins = 0
        self.leaves = 0
        self.lost_requests = 0

    @property
    def count(self) -> int:
        """Replica engines serving the run now."""
        return len(self.joined)

    async def check(self, http: httpx.AsyncClient) -> None:
        """One round: remove the joined engines that are gone, then join the ready ones that are new."""
        for url, joined in list(self.joined.items()):
            if await _refused(http, url):
                await self._leave(http, url, joined, "its engine refuses connections (the replica job ended)")
            elif (held := await _requests_held(http, url)) is not None:
                self.held[url] = held
        for replica in self.run.replica_runs():
            ready = current_ready(replica)
            if ready is None:
                continue
            written_at = float(ready.get("written_at") or 0.0)
            for url in [u.rstrip("/") for u in ready.get("engine_urls") or []]:
                known = self.joined.get(url)
                if known is not None and known.written_at >= written_at:
                    continue
                if known is not None:  # requeued: a new engine at the same address, with the base weights
                    await self._leave(http, url, known, "its replica job restarted")
                if await _healthy(http, url):
                    await self._join(http, url, replica, written_at)

    async def _join(self, http: httpx.AsyncClient, url: str, replica: RunDir, written_at: float) -> None:
        token = read_token_file(replica.admin_token_file)
        async with self.tracker.lock:
            version = self.tracker.served_version
            updater = self.tracker.updater
            if version > 0 and self.tracker.update_weights and updater is not None:
                own = WeightUpdater([url], admin_token=token, run_id=self.run_id, timeout_s=self.reload_timeout_s)
                try:
                    await own.load_broadcast(self.run.broadcast_step(version), version)
                except Exception as exc:  # noqa: BLE001 - a replica that cannot take the policy never serves
                    log.warning(
                        "replica %s could not load policy version %d (%s); trying again later", url, version, exc
                    )
                    return
                finally:
                    await own.aclose()
            if updater is not None:
                updater.add_engine(url, token)
        try:
            # vllm-router checks the new worker's health before it answers; one it already has is a 400 that says so
            # (an earlier add that outlived its timeout here)
            resp = await http.post(f"{self.router_url}/add_worker", params={"url": url}, timeout=ROUTER_ADD_TIMEOUT_S)
            if not (resp.status_code == 400 and "already exists" in resp.text):
                resp.raise_for_status()
        except httpx.HTTPError as exc:
            log.warning("router %s did not add replica %s (%s); trying again later", self.router_url, url, exc)
            async with self.tracker.lock:
                if updater is not None:
                    updater.remove_engine(url)
            return
        self.joined[url] = Joined(replica, written_at)
        self.joins += 1
        self._record("join", url, replica, version, "its engine answers and holds the run's policy")
        log.info("replica %s (%s) joined with policy version %d", url, replica.root.name, version)

    async def _leave(self, http: httpx.AsyncClient, url: str, joined: Joined, why: str) -> None:
        with contextlib.suppress(httpx.HTTPError):  # best effort: the router's own health check removes it too
            await http.post(f"{self.router_url}/remove_worker", params={"url": url}, timeout=PROBE_TIMEOUT_S)
        async with self.tracker.lock:
            if self.tracker.updater is not None:
                self.tracker.updater.remove_engine(url)
        self.joined.pop(url, None)
        held = self.held.pop(url, 0)
        self.leaves += 1
        self.lost_requests += held
        self._record("leave", url, joined.replica, self.tracker.served_version, why, requests_held=held)
        log.warning("replica %s (%s) left: %s", url, joined.replica.root.name, why)

    def _record(self, event: str, url: str, replica: RunDir, version: int, why: str, **extra: int) -> None:
        record = {"event": event, "url": url, "replica": replica.root.name, "version": version, "time": time.time()}
        try:
            fsutil.append_jsonl(self.run.replica_events, {**record, "why": why, **extra})
        except OSError as exc:
            log.warning("could not record the %s of replica %s: %s", event, url, exc)

    async def run_until(self, stop: asyncio.Event) -> None:
        """:meth:`check` every ``poll_s`` seconds until ``stop`` is set; never raises (a failed round is logged)."""
        async with httpx.AsyncClient() as http:
            await poll_until(stop, self.poll_s, lambda: self.check(http), "replica check")


async def _healthy(http: httpx.AsyncClient, url: str) -> bool:
    try:
        return (await http.get(f"{url}/health", timeout=PROBE_TIMEOUT_S)).status_code == 200
    except httpx.HTTPError:
        return False


async def _requests_held(http: httpx.AsyncClient, url: str) -> int | None:
    """Requests running or waiting in the engine at ``url`` (its ``/metrics``); None when it did not answer."""
    try:
        resp = await http.get(f"{url}/metrics", timeout=PROBE_TIMEOUT_S)
        resp.raise_for_status()
    except httpx.HTTPError:
        return None
    counts = [parse_metric(resp.text, name) for name in (RUNNING, WAITING)]
    return int(sum(c or 0.0 for c in counts))


async def _refused(http: httpx.AsyncClient, url: str) -> bool:
    """True when nothing listens at ``url`` any more (the engine watch's probe: a busy engine that answers late
    is not gone)."""
    return (await probe_engine(http, url, PROBE_TIMEOUT_S)).reachable is False
