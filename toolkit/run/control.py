"""Control files of a run (``control/``): the stop request that asks every role of the run to stop cleanly.

Roles poll ``run.stop_request``; the local launcher, ``srl cancel`` and the batch job's supervisor write it on a
user's stop (an empty request), a role writes ``<component>: <reason>`` when one of its stop criteria fires.
"""

from __future__ import annotations

import logging

from toolkit.fsutil import atomic_write_text
from toolkit.run.layout import RunDir

from . import ending

log = logging.getLogger(__name__)


def request_stop(run: RunDir, reason: str, *, component: str = "orchestrator") -> None:
    """Record the stop criterion in the run's ending (:mod:`toolkit.run.ending`), then write the stop request
    ``<component>: <reason>`` (unless one exists already) and log the reason. Raises OSError."""
    log.warning("requesting stop: %s", reason)
    parsed = ending.criterion_of(f"{component}: {reason}")
    if parsed is not None and not (run.stop_request.exists() and ending.read(run) is None):
        # Before the stop request, so a supervisor that sees the request also finds the criterion; a request
        # already there without a record is a user's stop, which this criterion does not overrule.
        ending.record_criterion(run, parsed[1], reason, role=component)
    if run.stop_request.exists():
        return
    run.control.mkdir(parents=True, exist_ok=True)
    atomic_write_text(run.stop_request, f"{component}: {reason}\n")
