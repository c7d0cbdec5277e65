"""Shared pytest fixtures. Each section belongs to one area; append new sections, keep them independent."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

# ---- Slurm: the real local test cluster (tests/slurm_cluster.py, .ci/setup-slurm.sh) -----------------------
from slurm_cluster import ClusterUnavailable, LocalSlurmCluster


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[LocalSlurmCluster]:
    """The 4-node local Slurm cluster, started if not already up; stopped at the end only if a test session
    started it and no other session still uses it (see LocalSlurmCluster.acquire/release).

    Skips (with the installer's message) only when Slurm cannot be installed; any other start failure fails.
    """
    cluster = LocalSlurmCluster()
    try:
        cluster.acquire()
    except ClusterUnavailable as e:
        pytest.skip(str(e))
    yield cluster
    cluster.release()


@pytest.fixture(autouse=True)
def _slurm_marker_needs_cluster(request: pytest.FixtureRequest) -> None:
    # A test marked `slurm` gets the cluster without naming the fixture.
    if request.node.get_closest_marker("slurm") is not None:
        request.getfixturevalue("slurm_cluster")


# ---- hypothesis: CI replays a fixed set of examples ------------------------------------------------------------
# Locally every run explores new examples (that is how the NUL-byte path bug was found); CI (.ci/run sets
# HYPOTHESIS_PROFILE=ci) draws the same examples on every run, so a red CI always means a change broke something.
import os  # noqa: E402

from hypothesis import settings  # noqa: E402

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
