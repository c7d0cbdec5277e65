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
it needs is served.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from toolkit.inference.weights import newest_stable_broadcast
from toolkit.rundir import RunDir

log = logging.getLogger(__name__)


def min_policy_version(step: int, max_async_level: int) -> int:
    """Oldest policy version allowed in the batch of trainer step ``step`` (>= 0): ``step - 1 - max_async_level``."""
    return max(0, step - 1 - max_async_level)


def off_policy_age(step: int, policy_version: int) -> int:
    """Versions between the policy that sampled a rollout and the trainer's policy at ``step``: ``step-1-v``."""
    return max(0, step - 1 - policy_version)


def is_stale(step: int, policy_version: int, max_off_policy_steps: int) -> bool:
    """True when a rollout of ``policy_version`` is too old for the batch of ``step``."""
    return off_policy_age(step, policy_version) > max_off_policy_steps


class PolicyTracker:
    """Follows ``run.broadcasts`` and keeps the engines and the client on the newest STABLE policy.

    ``client`` is the ``PolicyClient`` (its ``policy_version`` is set after each load); ``updater`` a
    ``WeightUpdater`` (None only when ``update_weights`` is false); ``served_version`` the version the engines
    serve at start (from the inference ready file; 0 = base model). ``poll_s``: seconds between broadcast scans.
    """

    def __init__(
        self, run: RunDir, client: Any, updater: Any | None, *, update_weights: bool = True,
        served_version: int = 0, poll_s: float = 0.2,
    ) -> None:  # fmt: skip
        if update_weights and updater is None:
            raise ValueError("update_weights needs a WeightUpdater")
        self.run = run
        self.client = client
        self.updater = updater
        self.update_weights = update_weights
        self.poll_s = poll_s
        self.served_version = served_version
        self.published_version = served_version  # newest STABLE broadcast seen
        self.update_seconds: list[float] = []
        self.failures = 0
        self._lock = asyncio.Lock()
        client.policy_version = served_version

    async def refresh(self) -> int:
        """Scan once; load a newer STABLE broadcast if there is one. Returns the served version.

        A failed load (engine down, reload error) is logged and retried at the next refresh; it never raises,
        so a restarting inference server cannot kill the orchestrator.
        """
        async with self._lock:
            found = newest_stable_broadcast(self.run)
            if found is None:
                return self.served_version
            version, path = found
            self.published_version = max(self.published_version, version)
            if not self.update_weights or version <= self.served_version:
                return self.served_version
            try:
                seconds = await self.updater.update(path, version)
            except Exception as exc:  # noqa: BLE001 - any failure is retried at the next poll
                self.failures += 1
                log.warning(
                    "weight update to version %d failed (%s); retrying at the next poll", version, exc
                )
                return self.served_version
            self.served_version = version
            self.client.policy_version = version
            self.update_seconds.append(seconds)
            log.info("policy version %d loaded into inference in %.2f s", version, seconds)
            return self.served_version

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

    async def follow(self, stop: asyncio.Event) -> None:
        """Background loop: :meth:`refresh` every ``poll_s`` seconds until ``stop`` is set."""
        while not stop.is_set():
            await self.refresh()
            try:
                await asyncio.wait_for(stop.wait(), self.poll_s)
            except asyncio.TimeoutError:
                pass
