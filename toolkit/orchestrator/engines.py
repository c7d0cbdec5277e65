"""Engine watch: survive an inference engine restart without serving a rollout from the wrong weights.

A launcher restarts a crashed engine with the same command and port (``inference.max_restarts``; local:
``toolkit.launch.local``, Slurm: the engine job step's restart loop). The restarted engine loads the *base* model
from disk; before it may serve rollouts it must hold the policy version the orchestrator tags them with. The
orchestrator owns weight updates (``PolicyTracker``), so it, not the launcher, restores the weights:

1. every ``poll_s`` seconds, under the tracker's lock (so a weight update in progress is never mistaken for a
   restart), each engine's ``GET /weight_info`` is probed: connection refused/reset = DOWN; an answer after DOWN,
   or a ``weight_version`` other than the served version's = RESTARTED (vLLM reports ``"default"`` until
   ``/update_weight_version`` is called); no answer in time = unchanged (a busy engine, or a restarting one whose
   port is bound but not yet serving);
2. while any engine is not OK the client's serving gate is closed (``PolicyClient.hold``): rollouts wait instead
   of failing, responses already in flight are discarded and re-sent, the tracker pauses its own updates, and env
   runtimes do not count the wait against rollout timeouts;
3. once every engine answers and none is DOWN, the newest STABLE broadcast is loaded into all engines together
   (``PolicyTracker.restore``) and only then the gate opens.

Why the orchestrator and not the launcher: a launcher-side reload would race with the tracker's own updates (two
writers could leave engines on an older version than the one rollouts are tagged with), and on Slurm the launcher
is a bash loop on another node. Why hold all generation while one replica of several is down: the router would
re-admit a restarted replica on its own health check, possibly before its weights are restored.

A launcher that gives up (``max_restarts`` used, or the restart not healthy within ``startup_timeout_s``) ends
the run; the client's retry budget (:func:`provider_retry_budget_s`) is sized to outlast one restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

# The weight updater writes the versions the engines report; its module exposes the format it writes them in.
from toolkit.inference.weights import VERSIONS_PATH, format_version

log = logging.getLogger(__name__)

OK, DOWN, RESTARTED = "ok", "down", "restarted"
# Margin over one engine start-up for noticing the death, the restart and the weight reload, seconds.
RESTORE_MARGIN_S = 120.0


def provider_retry_budget_s(startup_timeout_s: float, max_restarts: int) -> float | None:
    """How long (seconds) the policy client retries transient failures: one engine start-up plus
    ``RESTORE_MARGIN_S`` when engines are restarted; None (a few quick retries, the old behaviour) when
    ``max_restarts`` is 0, since then an engine death ends the run."""
    return float(startup_timeout_s) + RESTORE_MARGIN_S if max_restarts > 0 else None


@dataclass(frozen=True)
class Probe:
    """One ``/weight_info`` probe. ``reachable``: True (answered), False (refused/reset), None (no answer in
    time). ``version``: the reported weight version, None when the route is missing or refused us."""

    reachable: bool | None
    version: str | None = None


def expected_versions(served_version: int, run_id: str | None = None) -> frozenset[str]:
    """The ``weight_version`` strings an engine serving policy ``served_version`` may report (version 0 is the
    base model, which a freshly started engine reports as ``"default"``). A run's own loads record
    ``"<run id>:<step>"`` (``toolkit.inference.versions.format_version``), so with ``run_id`` that string counts too."""
    own = {format_version(run_id, served_version)}
    if served_version == 0:  # "base": the base model loaded back by a run that found another run's weights
        return frozenset({"default", "base", "0", *own})
    return frozenset({str(served_version), *own})


def next_state(
    previous: str, probe: Probe, served_version: int, tolerated: str | None = None, run_id: str | None = None
) -> str:
    """Engine state after ``probe`` (OK, DOWN or RESTARTED) given the ``previous`` one. See the module doc.
    ``tolerated``: a version string accepted besides the expected ones (what an external engine reported when the
    orchestrator started, e.g. a version left by an earlier run); ``run_id``: see :func:`expected_versions`."""
    if probe.reachable is None:
        return previous
    if not probe.reachable:
        return DOWN
    if previous in (DOWN, RESTARTED):
        return RESTARTED  # back after an outage: its weights are unknown until restored
    if (
        probe.version is not None
        and probe.version not in expected_versions(served_version, run_id)
        and probe.version != tolerated
    ):
        return RESTARTED
    return OK


async def probe_engine(http: httpx.AsyncClient, url: str, timeout_s: float, adapter: str | None = None) -> Probe:
    """``GET <url>/weight_info`` within ``timeout_s`` seconds, classified as a :class:`Probe`. With ``adapter`` (a
    LoRA run once its adapter is served), the version of that adapter instead (``GET /srl/weight_versions``; a
    LoRA load leaves the base weights' version alone), ``"missing"`` when the engine does not hold it (restarted)."""
    try:
        resp = await http.get(f"{url}{VERSIONS_PATH if adapter else '/weight_info'}", timeout=timeout_s)
    except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError):
        return Probe(False)
    except httpx.HTTPError:  # timeouts: busy, or bound but not serving yet
        return Probe(None)
    if resp.status_code != 200:
        return Probe(True)  # answers, but without the route (older vLLM) or refusing our token
    try:
        data = resp.json()
        version = (data.get("adapters") or {}).get(adapter, "missing") if adapter else data.get("weight_version")
    except (ValueError, AttributeError):
        version = None
    return Probe(True, None if version is None else str(version))


class EngineWatch:
    """Keeps the client's serving gate closed while any engine is down or restarted without the current policy.

    ``client``: the ``PolicyClient`` (``hold``/``release``); ``tracker``: the ``PolicyTracker`` (``lock``,
    ``served_version``, ``engines_ok``, ``restore``); ``engine_urls``: every engine's own base URL;
    ``headers``: admin headers for ``/weight_info``; ``poll_s`` and ``probe_timeout_s`` in seconds.
    """

    def __init__(
        self,
        client: Any,
        tracker: Any,
        engine_urls: Sequence[str],
        *,
        headers: Mapping[str, str],
        poll_s: float = 1.0,
        probe_timeout_s: float = 5.0,
    ) -> None:
        self.client = client
        self.tracker = tracker
        self.engine_urls = [u.rstrip("/") for u in engine_urls]
        self.headers = dict(headers)
        self.poll_s = poll_s
        self.probe_timeout_s = probe_timeout_s
        self.states = {u: OK for u in self.engine_urls}
        self._since: float | None = None
        # url -> (served version, reported version) accepted at the first probe (see next_state's ``tolerated``)
        self._tolerated: dict[str, tuple[int, str]] = {}
        self._first = True

    async def check(self, http: httpx.AsyncClient) -> None:
        """Probe every engine once and hold, restore or release accordingly."""
        async with self.tracker.lock:
            served = self.tracker.served_version
            updater = getattr(self.tracker, "updater", None)
            run_id = getattr(updater, "run_id", None)  # the run's loads name it
            adapter = getattr(updater, "served_model", None)  # a LoRA run: its adapter's version is the policy's
            probes = await asyncio.gather(
                *(probe_engine(http, u, self.probe_timeout_s, adapter) for u in self.engine_urls)
            )
            for url, probe in zip(self.engine_urls, probes, strict=True):
                if self._first and probe.reachable and probe.version not in (None, *expected_versions(served, run_id)):
                    log.warning(
                        "engine %s reports weight version %r while policy version %d is expected; taking it as served",
                        url,
                        probe.version,
                        served,
                    )
                    self._tolerated[url] = (served, probe.version)
                tol = self._tolerated.get(url)
                self.states[url] = next_state(
                    self.states[url], probe, served, tol[1] if tol and tol[0] == served else None, run_id
                )
            self._first = False
        bad = {u: s for u, s in self.states.items() if s != OK}
        if not bad:
            return
        if self._since is None:
            self._since = time.monotonic()
            self.client.hold()
            self.tracker.engines_ok = False
            log.warning(
                "inference engine(s) %s: holding generation until they serve policy version %d again", bad, served
            )
        if any(s == DOWN for s in bad.values()):
            return
        if not await self.tracker.restore():
            return  # logged by restore; tried again at the next poll
        outage = time.monotonic() - self._since
        for u in self.engine_urls:
            self.states[u] = OK
        self._since = None
        self.tracker.engines_ok = True
        self.client.release()
        log.info(
            "inference back after %.1f s: restarted engine(s) %s hold policy version %d; generation resumes",
            outage,
            sorted(bad),
            self.tracker.served_version,
        )

    async def run(self, stop: asyncio.Event) -> None:
        """Check every ``poll_s`` seconds until ``stop`` is set; never raises (a failed probe is logged)."""
        async with httpx.AsyncClient(headers=self.headers) as http:
            await poll_until(stop, self.poll_s, lambda: self.check(http), "engine watch check")


async def poll_until(stop: asyncio.Event, poll_s: float, check: Any, what: str) -> None:
    """Await ``check()`` every ``poll_s`` seconds until ``stop`` is set. Never raises: a failed round is logged as
    ``what`` failed, and the next round runs (a watch must outlive any single failure)."""
    while not stop.is_set():
        try:
            await check()
        except Exception:
            log.exception("%s failed", what)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), poll_s)
