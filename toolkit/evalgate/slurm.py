"""Waiting for the first-run gate's Slurm job (launched by ``toolkit.evalgate.main`` through the one launch
pipeline, kind ``eval``) and reading its verdict back.

Job state comes from ``toolkit.launch.slurm`` (``scontrol``/``squeue``), never from ``sacct``: many clusters, the
local test cluster included, have no accounting. The verdict is read back from the run's ``reports/``, written by
the job.
"""

from __future__ import annotations

import time

from toolkit.run.layout import RunDir
from toolkit.run.verdict import GATE_STEMS, Verdict, read_verdict


def wait_gate(
    job_id: str, run: RunDir, *, command: str, submitted_at: float, timeout_s: float, poll_s: float = 1.0
) -> tuple[int, Verdict | None, str]:
    """Wait for gate job ``job_id`` to end; returns (exit code, verdict, Slurm state).

    ``run``: the run whose ``reports/`` receive the verdict; ``submitted_at``: epoch seconds before the submission
    (an older verdict is not this job's). The exit code is 0 for a passed gate, 1 for a failed one, 3 when the job
    ended without a verdict (killed, timed out, crashed; see its logs). Raises TimeoutError after ``timeout_s``
    seconds.
    """
    from toolkit.launch import slurm

    state = slurm.wait(job_id, timeout_s=timeout_s, poll_s=poll_s)
    stem = GATE_STEMS[command]
    verdict = None
    deadline = time.monotonic() + 15.0  # the shared filesystem may show the report a moment after the job ends
    while verdict is None and time.monotonic() < deadline:
        verdict = read_verdict(run, stem, newer_than=submitted_at)
        if verdict is None:
            time.sleep(0.5)
    if verdict is None:
        return 3, None, state.state
    if state.state == "COMPLETED" and verdict.passed:
        return 0, verdict, state.state
    return 1, verdict, state.state
