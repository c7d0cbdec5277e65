"""Unit tests plan and render jobs for the sites of other clusters (generic-hpc, prime-intellect) on this machine,
whose local Slurm test cluster is up or down depending on what ran before. In-process, the login node's partition
check (toolkit.preflight.partitions) therefore reads as on a machine without a Slurm client, so these tests do not
depend on that. The check itself is tested with recorded Slurm answers (test_preflight_partitions.py) and against
the real cluster (tests/integration/test_submit_refused_slurm.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _no_slurm_client_for_partition_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    from toolkit.preflight import partitions

    def no_client(argv: list[str]) -> str:
        raise FileNotFoundError(f"{argv[0]} is not on PATH")

    monkeypatch.setattr(partitions, "_run", no_client)
