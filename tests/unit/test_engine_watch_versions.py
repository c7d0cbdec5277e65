"""The orchestrator's engine watch accepts the run-qualified weight version its own loads record.

A run's weight loads record ``"<run id>:<step>"`` at ``/weight_info``; the watch must take that as "serving the
current policy", or it would call every engine restarted after each reload and load the same weights again.
"""

from __future__ import annotations

from toolkit.inference.versions import format_version
from toolkit.orchestrator.engines import OK, RESTARTED, Probe, expected_versions, next_state


def test_the_runs_own_version_string_is_the_served_policy():
    assert format_version("r1", 3) in expected_versions(3, "r1")
    assert next_state(OK, Probe(True, format_version("r1", 3)), 3, run_id="r1") == OK
    assert next_state(OK, Probe(True, "3"), 3, run_id="r1") == OK  # loads outside a run name no run


def test_another_step_or_another_runs_weights_are_not():
    assert next_state(OK, Probe(True, format_version("r1", 2)), 3, run_id="r1") == RESTARTED
    assert next_state(OK, Probe(True, format_version("r2", 3)), 3, run_id="r1") == RESTARTED
    assert next_state(OK, Probe(True, "default"), 3, run_id="r1") == RESTARTED  # a restarted engine
