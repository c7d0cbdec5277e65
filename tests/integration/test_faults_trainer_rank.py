"""kill -9 one rank of a 2-rank trainer (issue 9 item 2), locally and on the real local Slurm cluster.

Locally: the real reverse-text job (vLLM on CPU, env workers, orchestrator) under the local launcher, with the
trainer as one torchrun agent and two gloo/FSDP2 ranks. Rank 1 (the worker, not torchrun) is SIGKILLed at a random
moment after step 2: gloo raises "Connection closed by peer" on rank 0, torchrun's agent stops it and exits
non-zero, and the launcher ends the whole run within seconds naming the trainer. The same job with ``--resume``
continues from the newest COMPLETE checkpoint; metrics.jsonl ends with every trainer step exactly once.

The config has no field for two CPU trainer ranks on one machine (a single_node deployment gives
``max(1, num_train_gpus)`` ranks and CPU means 0 GPUs; multi_node needs a Slurm site), so the local attempts are
started by this file's ``__main__`` driver: the same steps as ``srl rl`` (load config, prepare the run, plan,
``run_local``) with the plan's trainer given the torchrun command ``build_plan`` emits for two ranks on one node.

On Slurm: ``jobs/reverse-text/rl.toml @ jobs/reverse-text/slurm.toml`` (a 2-node trainer, one torchrun agent per
node, rendezvous on the first trainer node). The rank on the second trainer node (RANK=1 in its environment, this
job's SLURM_JOB_ID) is SIGKILLed after step 2: its agent exits non-zero, ``srun --kill-on-bad-exit`` ends the
step, the batch script tears the job down. Expected: state FAILED within seconds, the batch log names the trainer.

Run with ``-s`` to see the measured figures.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: this file also runs as the driver script
from run_records import role_steps

from toolkit.run import heartbeat

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "jobs/reverse-text/rl.toml"
MAX_STEPS = 6
CKPT_INTERVAL = 2
START_TIMEOUT_S = 900  # engine start-up plus the first steps on a loaded 2-core machine
END_WITHIN_S = 60  # "within seconds, not at walltime": generous for a loaded machine; measured figures printed


# ---- helpers shared by both tests ------------------------------------------------------------------------------
def _steps(run: Path, role: str) -> list[int]:
    return role_steps(run, role, first=1)


def _complete_steps(run: Path) -> list[int]:
    return sorted(int(p.parent.name[5:]) for p in (run / "checkpoints").glob("step_*/COMPLETE"))


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(kv.split("=", 1) for kv in raw.decode(errors="replace").split("\0") if "=" in kv)


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _rank_pid(run: Path, rank: int, **env: str) -> int:
    """PID of trainer rank ``rank`` of ``run``: a ``toolkit.trainer.main`` worker (not the torchrun agent, which
    has no RANK) whose environment has RANK=rank, SRL_RUN_DIR=run and every ``env`` item."""
    want = {"RANK": str(rank), "SRL_RUN_DIR": str(run), **env}
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        argv = _cmdline(int(d.name))
        if "toolkit.trainer.main" not in argv or "torch.distributed.run" in argv or "torchrun" in " ".join(argv[:2]):
            continue
        e = _environ(int(d.name))
        if all(e.get(k) == v for k, v in want.items()):
            found.append(int(d.name))
    assert len(found) == 1, f"expected one trainer rank {rank} process of {run}, found {found}"
    return found[0]


def _both_ranks_wait_for_batch(run, step: int) -> bool:
    """Whether the progress records of trainer ranks 0 and 1 of ``run`` (a RunDir) both say they wait for the
    orchestrator's batch of ``step``."""
    records = heartbeat.read_all(run)
    return all(
        (r := records.get(f"trainer.rank{rank}")) is not None
        and r.get("step") == step
        and r.get("waiting_for") == "orchestrator"
        for rank in (0, 1)
    )


def _alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (PID 1 reaps late here, see the local-slurm notes)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


# ---- local: the __main__ driver -----------------------------------------------------------------------------------
def _two_rank_trainer(plan) -> None:
    """Give the plan's trainer two ranks on its node: the torchrun command ``build_plan`` writes for
    ``nproc_per_node`` > 1 (c10d rendezvous on the master address and the plan's rdzv port)."""
    t = plan.process("trainer")
    t.command = [
        "torchrun",
        "--nnodes",
        "1",
        "--nproc-per-node",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"{{master_addr}}:{t.ports['rdzv']}",
        "--rdzv-id",
        f"srl-{plan.job_id}",
        "-m",
        "toolkit.trainer.main",
        "--run-dir",
        t.env["SRL_RUN_DIR"],
    ]
    t.nprocs_per_node = 2
    t.env["SRL_TRAINER_DP"] = "2"
    plan.trainer_dp = 2


def _driver(argv: list[str]) -> int:
    """``python test_faults_trainer_rank.py OVERLAY [--resume] [--trainer-only]``: one local attempt of the job with
    a 2-rank trainer (and only the trainer with ``--trainer-only``); returns the launcher's exit status."""
    from toolkit.config import load_config
    from toolkit.launch.local import run_local
    from toolkit.launch.prepare import prepare_run
    from toolkit.placement.plan import ROLES, launch_plan, write_plan
    from toolkit.preflight.site import load_site

    resume = "--resume" in argv
    roles = ("trainer",) if "--trainer-only" in argv else None
    loaded = load_config([JOB, Path(argv[0])])
    run, attempt = prepare_run(loaded, argv=["srl", "rl", "@", str(JOB), "@", argv[0]], resume=resume)
    plan = launch_plan(loaded.config, load_site(loaded.config.site), run, roles=roles or ROLES, probe=True)
    _two_rank_trainer(plan)
    write_plan(run, plan)
    return run_local(loaded.config, run, plan, attempt=attempt)


def _start_local(overlay: Path, resume: bool, *flags: str) -> subprocess.Popen:
    argv = [sys.executable, __file__, str(overlay), *(["--resume"] if resume else []), *flags]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )


def _finish(proc: subprocess.Popen, timeout_s: float) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"launcher did not exit within {timeout_s} s:\n{out[-6000:]}")
    return proc.returncode, out


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_local_launcher_ends_run_when_a_rank_dies_while_ranks_wait_for_a_batch(tmp_path):
    """No vLLM: the launcher supervises only the 2-rank trainer, fed two batches by this test. Rank 1 is killed
    while both ranks wait for batch 3 (outside any collective): torchrun stops rank 0, the run ends at once."""
    import numpy as np

    from toolkit.batches import write_batch
    from toolkit.models.tiny import build_tiny_model
    from toolkit.run.layout import RunDir
    from toolkit.run.types import TrainingSample

    model = build_tiny_model(tmp_path / "model", seed=0)
    out = tmp_path / "out"
    run = out / "waiting"
    overlay = tmp_path / "overlay.toml"
    overlay.write_text(
        f'max_steps = 4\noutput_dir = "{out}"\n[run]\nname = "waiting"\n[model]\nname = "{model}"\n'
        "[trainer]\nseq_len = 64\nmicro_batch_size = 1\nbatch_timeout_s = 600\n"
    )
    rng = np.random.default_rng(0)
    rd = RunDir(run)
    for step in (1, 2):
        samples = [
            TrainingSample(
                rng.integers(4, 100, 6).tolist(),
                rng.integers(4, 100, 20).tolist(),
                [True] * 20,
                (-rng.random(20) * 3).tolist(),
            )
            for _ in range(4)
        ]
        write_batch(rd, step, samples, rng.normal(size=4).tolist(), policy_versions=[0] * 4, envs=["e"] * 4, meta={})
    proc = _start_local(overlay, False, "--trainer-only")
    deadline = time.monotonic() + 300
    while max(_steps(run, "trainer"), default=0) < 2:
        assert proc.poll() is None, f"launcher exited early ({proc.returncode}):\n{proc.stdout.read()[-6000:]}"
        assert time.monotonic() < deadline, "trainer step 2 not reached in 300 s"
        time.sleep(0.2)
    # Both ranks' progress records say they wait for batch 3: past the step's collectives, polling for the file.
    deadline = time.monotonic() + 120
    while not _both_ranks_wait_for_batch(rd, 3):
        assert proc.poll() is None, f"launcher exited early ({proc.returncode}):\n{proc.stdout.read()[-6000:]}"
        assert time.monotonic() < deadline, f"both ranks not waiting for batch 3 in 120 s: {heartbeat.read_all(rd)}"
        time.sleep(0.2)
    rank0, rank1 = _rank_pid(run, 0), _rank_pid(run, 1)
    os.kill(rank1, signal.SIGKILL)
    t0 = time.monotonic()
    rc, text = _finish(proc, 180)
    took = time.monotonic() - t0
    assert rc != 0, text
    assert "trainer exited with status" in text and "--resume" in text, text[-4000:]
    assert took < END_WITHIN_S, f"the run took {took:.1f} s to end after rank 1 died"
    assert not _alive(rank0), "rank 0 outlived the run"
    print(f"\n[figure] trainer-only run: rank 1 kill -9 while waiting for a batch -> launcher exit {took:.1f} s")


@pytest.mark.slow
@pytest.mark.heavy
@pytest.mark.vllm
@pytest.mark.timeout(2 * START_TIMEOUT_S + 600)
def test_local_kill_one_trainer_rank_ends_run_and_resume_loses_no_step(tmp_path):
    out = tmp_path / "out"
    run = out / "rank"
    overlay = tmp_path / "overlay.toml"
    overlay.write_text(
        f'max_steps = {MAX_STEPS}\noutput_dir = "{out}"\n[run]\nname = "rank"\n'
        f"[ckpt]\ninterval = {CKPT_INTERVAL}\n[orchestrator]\nbatch_size = 16\n"
    )
    rng = random.Random(11)
    figures: dict = {}

    proc = _start_local(overlay, resume=False)
    deadline = time.monotonic() + START_TIMEOUT_S
    while max(_steps(run, "trainer"), default=0) < 2:
        assert proc.poll() is None, f"launcher exited early ({proc.returncode}):\n{proc.stdout.read()[-6000:]}"
        assert time.monotonic() < deadline, f"trainer step 2 not reached in {START_TIMEOUT_S} s"
        time.sleep(0.5)
    time.sleep(rng.uniform(0.0, 3.0))  # a random moment of the step in flight
    rank0, rank1 = _rank_pid(run, 0), _rank_pid(run, 1)
    os.kill(rank1, signal.SIGKILL)
    t0 = time.monotonic()
    rc, text = _finish(proc, 300)
    figures["rank 1 kill -9 -> launcher exit (s)"] = round(time.monotonic() - t0, 1)
    assert rc != 0, text
    assert "trainer exited with status" in text, text[-4000:]
    assert "--resume" in text, text[-4000:]  # the launcher says how to continue
    assert time.monotonic() - t0 < END_WITHIN_S, "the run must end within seconds of a rank's death"
    assert not _alive(rank0), "rank 0 outlived the run"
    log = (run / "logs" / "attempt_1" / "trainer.log").read_text()
    assert "Connection closed by peer" in log or "exitcode: -9" in log, log[-4000:]
    killed_after = max(_steps(run, "trainer"))
    complete = _complete_steps(run)
    assert complete and complete[-1] >= CKPT_INTERVAL, complete

    proc = _start_local(overlay, resume=True)
    rc, text = _finish(proc, START_TIMEOUT_S + 600)
    assert rc == 0, text[-6000:]
    resumed = (run / "logs" / "attempt_2" / "trainer.log").read_text()
    assert f"checkpoints/step_{complete[-1]} step {complete[-1]}" in resumed, resumed[-4000:]
    for role in ("trainer", "orchestrator"):
        counts = Counter(_steps(run, role))
        assert sorted(counts) == list(range(1, MAX_STEPS + 1)), (role, sorted(counts))
        assert set(counts.values()) == {1}, (role, counts)  # no step twice
    assert (run / "checkpoints" / f"step_{MAX_STEPS}" / "COMPLETE").is_file()
    print(
        f"\n[figure] local 2-rank trainer: {figures}; killed after trainer step {killed_after}, resumed from "
        f"COMPLETE step {complete[-1]}, {MAX_STEPS} steps each recorded once"
    )


# ---- Slurm ---------------------------------------------------------------------------------------------------------
def _batch_log(run: Path) -> str:
    parts = [f.read_text() for f in sorted((run / "logs").glob("*.out"))]
    for f in sorted((run / "logs").glob("attempt_*/trainer*.log")):
        parts.append(f"---- {f.name}\n" + "\n".join(f.read_text().splitlines()[-15:]))
    return "\n".join(parts)[-10000:]


@pytest.mark.slow
@pytest.mark.heavy
@pytest.mark.slurm
@pytest.mark.vllm
@pytest.mark.timeout(START_TIMEOUT_S + 600)
def test_slurm_kill_rank_on_second_trainer_node_fails_job_within_seconds(tmp_path):
    from toolkit.launch import slurm
    from toolkit.launch.submit import read_job_ids
    from toolkit.placement import read_plan
    from toolkit.run.layout import RunDir

    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "-m",
        "toolkit.cli",
        "rl",
        "@",
        str(JOB),
        "@",
        str(REPO / "jobs/reverse-text/slurm.toml"),
        "--output-dir",
        str(out),
        "--run.name",
        "rank",
        "--max-steps",
        "40",
        "--ckpt.interval",
        "2",
    ]
    sub = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert sub.returncode == 0, sub.stdout + sub.stderr
    rd = RunDir(out / "rank")
    run = rd.root
    job = read_job_ids(rd)[-1][0]
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while max(_steps(run, "trainer"), default=0) < 2:
            st = slurm.job_state(job)
            assert not st.is_terminal, f"{st}\n{_batch_log(run)}"
            assert time.monotonic() < deadline, f"no trainer step 2 after {START_TIMEOUT_S} s\n{_batch_log(run)}"
            time.sleep(1.0)
        time.sleep(random.Random(5).uniform(0.0, 3.0))  # a random moment of the step in flight
        plan = read_plan(rd)
        second = plan.hosts[plan.process("trainer").node_indices[1]]
        victim = [
            pid
            for pid in map(int, filter(str.isdigit, os.listdir("/proc")))
            if "toolkit.trainer.main" in _cmdline(pid)
            and "torch.distributed.run" not in _cmdline(pid)
            and _environ(pid).get("SLURM_JOB_ID") == job
            and _environ(pid).get("SLURMD_NODENAME") == second
            and "RANK" in _environ(pid)
        ]
        assert len(victim) == 1, (victim, second)
        rank = _environ(victim[0])["RANK"]
        others = [_rank_pid(run, r, SLURM_JOB_ID=job) for r in ("0", "1") if r != rank]
        os.kill(victim[0], signal.SIGKILL)
        t0 = time.monotonic()
        st = slurm.wait(job, timeout_s=300, poll_s=0.5)
        took = time.monotonic() - t0
    finally:
        slurm.cancel(job)
    log = _batch_log(run)
    assert st.state == "FAILED" and st.exit_code not in (None, 0), f"{st}\n{log}"
    assert "trainer exited first" in log, log
    assert took < END_WITHIN_S, f"job took {took:.1f} s to end after a trainer rank died\n{log}"
    assert not any(_alive(p) for p in others), "the other trainer rank outlived the job"
    print(
        f"\n[figure] slurm 2-node trainer: kill -9 of rank {rank} on {second} after trainer step "
        f"{max(_steps(run, 'trainer'))} -> job {job} {st.state} (exit {st.exit_code}) in {took:.1f} s"
    )


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(_driver(sys.argv[1:]))
