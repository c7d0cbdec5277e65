"""The smallest valid rl config as a dict, and helpers to vary and validate it (the config rule tests share them).

:func:`validate` runs what ``srl rl`` runs on a config: the schema and cross-field rules (``toolkit.config``),
then the checks of the outside world (``toolkit.preflight``)."""

from __future__ import annotations

import copy
from unittest import mock

import pytest

from toolkit.config import ConfigError, validate_dict
from toolkit.config.compose import deep_merge
from toolkit.preflight import Preflight, preflight

BASE = {
    "max_steps": 10,
    "orchestrator": {
        "batch_size": 64,
        "group_size": 8,
        "train": {"env": [{"taskset": {"id": "srl-reverse-text"}}]},
        "eval": {"env": [{"taskset": {"id": "srl-reverse-text", "split": "test"}}]},
    },
}


def config(*patches: dict, **fields) -> dict:
    """A fresh copy of :data:`BASE` with each patch, then the keyword ``fields``, deep-merged in (inputs untouched)."""
    out = copy.deepcopy(BASE)
    for patch in (*patches, fields):
        out = deep_merge(out, copy.deepcopy(patch))
    return out


def _no_slurm_client(argv: list[str]) -> str:
    raise FileNotFoundError(f"{argv[0]} is not on PATH")


def validate(data: dict, *, source: str | None = None, purpose: str = "rl") -> Preflight:
    """``data`` validated and preflighted (``.config``, ``.warnings``, ``.site``, ``.plan``); raises ConfigError.

    Slurm's partitions are not asked (as on a machine without a Slurm client): these configs name the sites of
    other clusters, and this machine's test cluster may be up or down (tests/unit/conftest.py says the same)."""
    from toolkit.preflight import partitions

    with mock.patch.object(partitions, "_run", _no_slurm_client):
        return preflight(validate_dict(data, source=source, purpose=purpose))


def errors_of(data: dict) -> str:
    """The ConfigError text ``data`` must raise (fails the test when it validates)."""
    with pytest.raises(ConfigError) as e:
        validate(data)
    return str(e.value)


def warnings_of(data: dict) -> str:
    """The warnings of a config that validates, one per line."""
    return "\n".join(str(w) for w in validate(data).warnings)
