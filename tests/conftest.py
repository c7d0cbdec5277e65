"""Shared pytest fixtures. Each section belongs to one area; append new sections, keep them independent."""

from __future__ import annotations

import pytest

# ---- Slurm: the real local test cluster (tests/slurm_cluster.py, .ci/setup-slurm.sh) -----------------------
from prereqs import IN_CI, ci_problems, missing
from slurm_cluster import ClusterUnavailable, LocalSlurmCluster

_CLUSTER = LocalSlurmCluster()
_cluster_held = False


def _hold_cluster() -> LocalSlurmCluster:
    """Start the cluster if needed and register this session as a user of it, once per session; released by
    pytest_sessionfinish. Raises ClusterUnavailable (see LocalSlurmCluster.start)."""
    global _cluster_held
    if not _cluster_held:
        _CLUSTER.acquire()
        _cluster_held = True
    return _CLUSTER


def _needs_cluster(item: pytest.Item) -> bool:
    return item.get_closest_marker("slurm") is not None or "slurm_cluster" in getattr(item, "fixturenames", ())


@pytest.fixture(scope="session")
def slurm_cluster() -> LocalSlurmCluster:
    """The 4-node local Slurm cluster, started if not already up; stopped at the end only if a test session
    started it and no other session still uses it (see LocalSlurmCluster.acquire/release).

    Skips (with the installer's message) only when Slurm cannot be installed or its commands are not on PATH, and
    under CI fails instead (tests/prereqs.py); any other start failure fails.
    """
    try:
        return _hold_cluster()
    except ClusterUnavailable as e:
        missing(f"the local Slurm cluster is unavailable: {e}")


@pytest.fixture(autouse=True)
def _slurm_marker_needs_cluster(request: pytest.FixtureRequest) -> None:
    # A test marked `slurm` gets the cluster without naming the fixture.
    if request.node.get_closest_marker("slurm") is not None:
        request.getfixturevalue("slurm_cluster")


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Every test that gets the cluster carries the `slurm` marker, also those that only name the fixture, so that
    # `-m slurm` / `-m "not slurm"` split the suite exactly: scripts/test.sh runs the two halves side by side.
    for item in items:
        if item.get_closest_marker("slurm") is None and _needs_cluster(item):
            item.add_marker(pytest.mark.slurm)


def pytest_collection_finish(session: pytest.Session) -> None:
    # CI must never pass by skipping: before the first test, check every prerequisite (tests/prereqs.py) and, when
    # the selection needs Slurm, get the cluster now, so that a machine without it fails in seconds rather than
    # after the tests that come before the first Slurm test; stop with one message naming everything missing.
    if not IN_CI or session.config.option.collectonly:
        return
    problems = ci_problems()
    if any(_needs_cluster(item) for item in session.items):
        try:
            _hold_cluster()
        except ClusterUnavailable as e:
            problems.append(f"the local Slurm cluster is unavailable: {e}")
    if problems:
        pytest.exit(
            "CI=true, but this machine lacks what the tests need:\n  - " + "\n  - ".join(problems),
            returncode=pytest.ExitCode.TESTS_FAILED,
        )


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _cluster_held:
        _CLUSTER.release()


# ---- hypothesis: CI replays a fixed set of examples ------------------------------------------------------------
# Locally every run explores new examples (that is how the NUL-byte path bug was found); CI (.ci/run sets
# HYPOTHESIS_PROFILE=ci) draws the same examples on every run, so a red CI always means a change broke something.
import os

from hypothesis import settings

# No per-example deadline in any profile: scripts/test.sh runs the unit tests beside the integration tests' engines,
# locally as in CI, and a verdict must not depend on how busy the machine was.
settings.register_profile("ci", derandomize=True, print_blob=True, deadline=None)
settings.register_profile("local", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "local"))


# ---- CI: no test passes by skipping for a failed import (tests/prereqs.py) -------------------------------------
from prereqs import pytest_make_collect_report, pytest_runtest_makereport  # noqa: F401 - hooks, found by name
