"""Async bound arithmetic and the policy tracker on a real broadcasts directory."""

import asyncio

import pytest

from toolkit.fsutil import write_marker
from toolkit.inference.weights import WeightUpdater
from toolkit.orchestrator.policy import (
    PolicyTracker,
    may_launch_ahead,
    min_policy_version,
    off_policy_age,
)
from toolkit.run.layout import RunDir


@pytest.mark.parametrize(
    "step, k, expected",
    [(1, 0, 0), (2, 0, 1), (5, 0, 4), (1, 1, 0), (2, 1, 0), (3, 1, 1), (10, 2, 7), (3, 4, 0)],
)
def test_min_policy_version(step, k, expected):
    assert min_policy_version(step, k) == expected


def test_age_agrees_with_the_bound():
    for step in range(1, 12):
        for k in range(4):
            need = min_policy_version(step, k)
            for v in range(step):
                assert (off_policy_age(step, v) > k) == (v < need)
    assert off_policy_age(3, 2) == 0 and off_policy_age(3, 0) == 2


def test_launch_ahead_only_when_no_rollout_would_be_dropped():
    # max_async_level 1: step 4 accepts policy >= 2. With policy 1 served, groups launched now for step 4 would
    # all be too old; with policy 2 they are in bound. Never past the last step.
    assert not may_launch_ahead(4, 10, served_version=1, max_async_level=1)
    assert may_launch_ahead(4, 10, served_version=2, max_async_level=1)
    assert not may_launch_ahead(11, 10, served_version=10, max_async_level=1)
    # Synchronous RL (k=0) can never run ahead of the trainer: step n needs policy n-1, published after batch n-1.
    assert not may_launch_ahead(3, 10, served_version=1, max_async_level=0)
    for step in range(1, 12):
        for k in range(4):
            for v in range(step):
                if may_launch_ahead(step, 20, v, k):
                    assert off_policy_age(step, v) <= k


class _Client:
    policy_version = -1


def _publish(run: RunDir, step: int, stable: bool = True) -> None:
    d = run.broadcast_step(step)
    d.mkdir(parents=True)
    if stable:
        write_marker(d / "STABLE")


def test_negative_control_paces_on_published_versions(tmp_path):
    run = RunDir(tmp_path)
    client = _Client()
    tr = PolicyTracker(run, client, None, update_weights=False, poll_s=0.01)
    assert client.policy_version == 0

    async def go():
        await asyncio.wait_for(tr.wait_for(0), 60)  # version 0 is served: returns with nothing published yet
        waiter = asyncio.create_task(tr.wait_for(2))
        await asyncio.sleep(0.05)
        assert not waiter.done()
        _publish(run, 1)
        _publish(run, 2, stable=False)  # not STABLE: does not count
        await asyncio.sleep(0.05)
        assert not waiter.done()
        (run.broadcast_step(2) / "STABLE").touch()
        return await asyncio.wait_for(waiter, 60)

    waited = asyncio.run(go())
    assert waited >= 0.05
    assert tr.published_version == 2 and tr.served_version == 0 and client.policy_version == 0


def test_failed_weight_update_is_retried_not_raised(tmp_path):
    # A real WeightUpdater against a closed port: the engine is down.
    run = RunDir(tmp_path)
    _publish(run, 1)
    client = _Client()
    tr = PolicyTracker(run, client, WeightUpdater(["http://127.0.0.1:9"], timeout_s=1.0), poll_s=0.01)

    async def go():
        assert await tr.refresh() == 0
        assert await tr.refresh() == 0
        stop = [False]
        return await tr.wait_for(1, should_stop=lambda: stop.__setitem__(0, True) or True)

    asyncio.run(go())
    assert tr.failures >= 2 and tr.served_version == 0 and client.policy_version == 0
    assert not tr.satisfied(1)
