"""The off-policy bound and the served policy version.

Versions and steps: trainer steps are 1..max_steps; after step n the trainer publishes ``broadcasts/step_<n>/``
(STABLE marker last) = policy version n; version 0 is the base model. The batch of trainer step n is consumed by a
trainer holding version n - 1, so a rollout of version v used at step n is ``age = (n - 1) - v`` versions stale
(0 = on-policy). With ``max_async_level = k`` the batch of step n must be sampled with version >= n - 1 - k, i.e.
age <= k (k = 0: fully on-policy). ``max_off_policy_steps`` (default k) is the age beyond which a rollout is
dropped.

:class:`PolicyTracker` watches the broadcasts, pushes each newer STABLE one into the engines through
``WeightUpdater`` (unless ``update_weights`` is false: the negative control that keeps serving the base model),
sets the client's ``policy_version`` so every generation is tagged with it, and lets a step wait until the policy
it needs is served. After an engine restart, :meth:`PolicyTracker.restore` loads the newest STABLE broadcast into
every engine before generation resumes (driven by ``engines.EngineWatch``; the reload record then has
``"restore": true``).

Reload record: after each successful load, and before the client tags any request with the new version, one JSON
line is appended to ``run.policy_reloads`` (``policy_reloads.jsonl``)::

    {"version": v, "time": unix s, "seconds": pause-to-resume s, "phases": {phase: s},
     "engines": {engine_url: version string from its /weight_info, or null}, "roles": {engine_url: role}}

``phases`` splits the update's wall time (``WeightUpdater.last_steps``: pause, reload, cache reset and version,
resume, ...), so a slow reload shows whether the engines were slow to pause (busy with requests) or to load.

``engines`` shows ``"<run id>:<version>"`` (``toolkit.inference.versions``): of the base weights, or, in a LoRA run, of
its adapter, whose name the record adds (``"adapter": "srl-lora-<run id>"``).
``roles`` ("engine", "prefill", "decode") comes from the inference readiness file (empty if unreadable). So a reader
can check that every engine (both sides of a prefill/decode deployment) served ``v`` before rollouts tagged ``v``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from toolkit import fsutil
from toolkit.engines.health import current_ready
from toolkit.run.layout import STABLE_MARKER, RunDir, newest_stable_broadcast, numbered_steps
from toolkit.run.types import Rollout

log = logging.getLogger(__name__)


def run_identity(run: RunDir) -> str:
    """The run's id (``run_meta.json``, kept across attempts), which every weight version it loads carries; the
    directory name for a run directory without one (written by hand, tests)."""
    try:
        return str(json.loads(run.run_meta.read_text())["run_id"])
    except (OSError, ValueError, KeyError, TypeError):
        return run.root.name


def min_policy_version(step: int, max_async_level: int) -> int:
    """Oldest policy version allowed in the batch of trainer step ``step`` (>= 0): ``step - 1 - max_async_level``."""
    return max(0, step - 1 - max_async_level)


def may_launch_ahead(next_step: int, max_steps: int, served_version: int, max_async_level: int) -> bool:
    """True when the groups of ``next_step`` may be launched now, with the policy ``served_version``: the step
    exists and that policy is recent enough for its bound (``min_policy_version``), so none of them would be
    dropped as too old for it."""
    return next_step <= max_steps and served_version >= min_policy_version(next_step, max_async_level)


def off_policy_age(step: int, policy_version: int) -> int:
    """Versions between the policy that sampled a rollout and the trainer's policy at ``step``: ``step-1-v``."""
    return max(0, step - 1 - policy_version)


def rollout_age(step: int, rollout: Rollout) -> int:
    """``off_policy_age`` of a rollout's tokens; 0 for a rollout the policy sampled no token of (an episode that a
    request stop ended before any model call, or whose only reply a response hook replaced): its reported version
    is only a placeholder, and its reward counts in its group whatever policy is served."""
    return off_policy_age(step, rollout.policy_version) if rollout.completion_len > 0 else 0


class PolicyTracker:
    """Follows ``run.broadcasts`` and keeps the engines and the client on the newest STABLE policy.

    ``client`` is the ``PolicyClient`` (its ``policy_version`` is set after each load); ``updater`` a
    ``WeightUpdater`` (None only when ``update_weights`` is false); ``served_version`` the version the engines
    serve at start (from the inference ready file; 0 = base model). ``poll_s``: seconds between broadcast scans.

    The scan interval is the orchestrator's hand-off latency from a STABLE broadcast to the weight load, on the
    critical path of every step that waits for a policy; a scan (a listing of ``broadcasts/``, a stat) costs about
    0.1 ms, so 20 ms scans cost ~0.5 % of a core, where 200 ms added ~0.1 s to the mean step of the tiny CPU job.
    """

    def __init__(
        self,
        run: RunDir,
        client: Any,
        updater: Any | None,
        *,
        update_weights: bool = True,
        served_version: int = 0,
        poll_s: float = 0.02,
    ) -> None:
        if update_weights and updater is None:
            raise ValueError("update_weights needs a WeightUpdater")
        self.run = run
        self.client = client
        self.updater = updater
        self.update_weights = update_weights
        self.poll_s = poll_s
        self.served_version = served_version
        self.published_version = served_version  # newest STABLE broadcast seen
        self.failures = 0
        self.engines_ok = True  # False while EngineWatch holds generation for a down/restarted engine
        # Held during every weight load; EngineWatch probes under it so an update is never taken for a restart.
        self.lock = asyncio.Lock()
        client.policy_version = served_version

    async def refresh(self) -> int:
        """Scan once; load a newer STABLE broadcast if there is one. Returns the served version.

        A failed load (engine down, reload error) is logged and retried at the next refresh; it never raises,
        so a restarting inference server cannot kill the orchestrator.
        """
        async with self.lock:
            if not self.engines_ok:
                return self.served_version  # an engine is down or restarting: restore() loads the newest
            found = newest_stable_broadcast(self.run)
            if found is None:
                return self.served_version
            version, path = found
            self.published_version = max(self.published_version, version)
            if not self.update_weights or version <= self.served_version:
                return self.served_version
            await self._load(version, path)
            return self.served_version

    async def restore(self) -> bool:
        """After an engine restart: load the newest STABLE broadcast into every engine (all together, so all serve
        one version), even when it is the version already believed served. Returns True when the engines now
        serve what the client tags rollouts with; False (logged) when the load failed or the served version's
        weights cannot be found, to be tried again. Without weight updates (negative control) or before the first
        broadcast, a restarted engine's base model is already right."""
        async with self.lock:
            found = newest_stable_broadcast(self.run)
            if not self.update_weights or (found is None and self.served_version == 0):
                return True
            if found is None:
                log.error(
                    "cannot restore policy version %d into a restarted engine: no STABLE broadcast in %s",
                    self.served_version,
                    self.run.broadcasts,
                )
                return False
            version, path = found
            return await self._load(version, path, restore=True)

    async def _load(self, version: int, path: Any, *, restore: bool = False) -> bool:
        """Load broadcast ``path`` (policy ``version``) into every engine (caller holds the lock). On success the
        version becomes the served one, the reload is recorded *before* the client tags requests with it, and True
        is returned; a failure is counted and logged, never raised (retried at the next poll or check)."""
        what = "restoring policy version %d into restarted engines" if restore else "weight update to version %d"
        try:
            seconds = await self.updater.load_broadcast(path, version)
        except Exception as exc:  # noqa: BLE001 - any failure is retried at the next poll
            self.failures += 1
            log.warning(what + " failed (%s); retrying", version, exc)
            return False
        self.served_version = version
        self.published_version = max(self.published_version, version)
        await self._record_reload(version, seconds, restore=restore)
        if self.updater.served_model:  # a LoRA run: the policy is served under the adapter's name
            self.client.model = self.updater.served_model
        self.client.policy_version = version
        log.info(
            "policy version %d loaded into %s in %.2f s",
            version,
            "the restarted engines" if restore else "inference",
            seconds,
        )
        return True

    async def _record_reload(self, version: int, seconds: float, *, restore: bool = False) -> None:
        """Append the reload record (module docstring). Best effort: a failed query or write is logged, never
        raised, because the weights are already served and the run must go on."""
        t = time.time()
        try:
            engines = await self.updater.served_versions()
        except Exception as exc:  # noqa: BLE001 - the record is evidence, not control flow
            log.warning("could not read /weight_info after loading version %d: %s", version, exc)
            engines = {url: None for url in getattr(self.updater, "engine_urls", [])}
        roles = (current_ready(self.run) or {}).get("roles") or {}
        record = {"version": version, "time": t, "seconds": seconds, "engines": engines, "roles": roles}
        if self.updater.last_steps:
            record["phases"] = {k: round(v, 4) for k, v in self.updater.last_steps.items()}
        if self.updater.served_model:  # a LoRA run: the adapter it loaded (named after the run)
            record["adapter"] = self.updater.served_model
        if restore:
            record["restore"] = True
        try:
            fsutil.append_jsonl(self.run.policy_reloads, record)
        except OSError as exc:
            log.warning("could not append the reload record of version %d: %s", version, exc)

    def satisfied(self, version: int) -> bool:
        """Whether a batch needing ``version`` can be sampled now.

        With weight updates: the engines serve >= ``version``. Negative control: the trainer has published
        >= ``version`` (pacing only; the engines keep the base model).
        """
        return (self.served_version if self.update_weights else self.published_version) >= version

    async def wait_for(self, version: int, should_stop: Callable[[], bool] = lambda: False) -> float:
        """Block until :meth:`satisfied` (``version``) or ``should_stop()``; returns seconds waited."""
        t0 = time.monotonic()
        while True:
            await self.refresh()
            if self.satisfied(version) or should_stop():
                return time.monotonic() - t0
            await asyncio.sleep(self.poll_s)

    async def load_first_at_least(self, version: int, should_stop: Callable[[], bool] = lambda: False) -> int:
        """Block until a STABLE broadcast of a version >= ``version`` exists, then serve the *oldest* such one (not
        the newest, as :meth:`refresh` does): an SFT run's evals measure the step they were due at while the trainer
        may already have moved on. Returns the served version (unchanged when ``should_stop()`` ends the wait or a
        load fails; a failure is logged and retried by the caller's next call)."""
        while not should_stop():
            async with self.lock:
                for step in numbered_steps(self.run.broadcasts):
                    d = self.run.broadcast_step(step)
                    if step >= version and (d / STABLE_MARKER).exists():
                        if step > self.served_version and self.update_weights:
                            await self._load(step, d)
                        return self.served_version
            await asyncio.sleep(self.poll_s)
        return self.served_version

    async def follow(self, stop: asyncio.Event) -> None:
        """Background loop: :meth:`refresh` every ``poll_s`` seconds until ``stop`` is set."""
        while not stop.is_set():
            await self.refresh()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.poll_s)
