"""``srl sft chain`` on the real local Slurm cluster: a 2-node torchrun SFT job, then the RL job behind it.

- The chain as a user submits it (``jobs/reverse-text/slurm.toml`` overlay on both runs): the SFT job (inference
  node for its online eval + 2 trainer nodes, gloo ranks) ends COMPLETED with its final model; the RL job was held
  by Slurm until then (``afterok``), starts from that model (its step-0 eval matches SFT's final eval within
  sampling noise, far above the random model) and ends COMPLETED.
- An SFT job that fails (a sample longer than ``data.seq_len``: the trainer refuses it before step 1) leaves the RL
  job cancelled by Slurm (dependency never satisfied) without it ever running, and ``srl status`` of the RL run
  says so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from toolkit.launch import slurm
from toolkit.launch.submit import read_job_ids
from toolkit.run.layout import RunDir

pytestmark = [pytest.mark.slow, pytest.mark.slurm, pytest.mark.vllm, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
EVAL = "eval/reverse-text-test/avg@4"
# SFT steps of the chain's first job: enough for its final eval to stand far above the random model's (the README
# job's SFT reads ~0.7 at step 100), few enough to keep this 2-node CPU test short.
SFT_STEPS = 120


def _srl(cwd: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "toolkit.cli", *args],
        cwd=cwd,
        text=True,
        capture_output=True,
        check=False,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        timeout=timeout,
    )


def _evals(run: Path) -> dict[int, float]:
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return {m["step"]: m[EVAL] for m in lines if EVAL in m}


def _logs(run: Path) -> str:
    parts = [p.read_text() for p in sorted(run.glob("logs/*.out"))]
    parts += [f"---- {p}\n" + p.read_text()[-3000:] for p in sorted(run.glob("logs/attempt_*/*.log"))]
    return "\n".join(parts)[-12000:]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("sft-slurm")
    r = _srl(
        d,
        "sft",
        "make-data",
        "data/rt.jsonl",
        "@",
        str(REPO / "jobs/reverse-text/rl.toml"),
        "--taskset.num-train-examples",
        "4000",
    )
    assert r.returncode == 0, r.stderr
    return d


def _chain(workdir: Path, name: str, *sft_extra: str) -> subprocess.CompletedProcess:
    slurm_toml = str(REPO / "jobs/reverse-text/slurm.toml")
    return _srl(
        workdir,
        "sft",
        "chain",
        "@",
        str(REPO / "jobs/reverse-text/sft.toml"),
        "@",
        slurm_toml,
        "--data.name",
        "data/rt.jsonl",
        "--max-steps",
        str(SFT_STEPS),
        "--eval.interval",
        str(SFT_STEPS),
        "--run.name",
        f"{name}-sft",
        *sft_extra,
        "--then",
        "@",
        str(REPO / "jobs/reverse-text/rl.toml"),
        "@",
        str(REPO / "jobs/reverse-text/rl-after-sft.toml"),
        "@",
        slurm_toml,
        "--max-steps",
        "2",
        "--orchestrator.eval.interval",
        "2",
        "--run.name",
        f"{name}-rl",
    )


def _jobs(run: Path) -> list[str]:
    return [j for j, _kind, _attempt in read_job_ids(RunDir(run))]


def test_chain_runs_sft_on_two_nodes_then_rl_from_its_model(workdir, slurm_cluster):
    r = _chain(workdir, "ok")
    assert r.returncode == 0, r.stdout + r.stderr
    sft, rl = workdir / "outputs" / "ok-sft", workdir / "outputs" / "ok-rl"
    (sft_job,), (rl_job,) = _jobs(sft), _jobs(rl)
    # Slurm holds the RL job until the SFT job completes.
    assert slurm.job_state(rl_job).state in ("PENDING", "RUNNING", "COMPLETED")
    s = slurm.wait(sft_job, timeout_s=1200, poll_s=2.0)
    assert s.state == "COMPLETED", _logs(sft)
    assert (sft / "model" / "config.json").is_file()
    plan = json.loads((sft / "launcher" / "placement.json").read_text())
    trainer = next(p for p in plan["processes"] if p["role"] == "trainer")
    assert trainer["num_nodes"] == 2 and "torchrun" in trainer["command"][0]
    rl_state = slurm.wait(rl_job, timeout_s=1200, poll_s=2.0)
    assert rl_state.state == "COMPLETED", _logs(rl)
    # Both jobs are final, so Slurm reports their times; without them the order check below would prove nothing.
    assert rl_state.start_time is not None and s.end_time is not None, (rl_state, s)
    assert rl_state.start_time >= s.end_time
    e, f = _evals(rl), _evals(sft)
    # Far above the random model (avg@4 ~0.07), so an RL step-0 eval that matches it shows RL started from SFT's model.
    assert f[0] < 0.3 and f[SFT_STEPS] >= 0.4, f
    assert abs(e[0] - f[SFT_STEPS]) < 0.15, (f, e)


def test_a_failed_sft_job_leaves_the_rl_job_cancelled_by_slurm(workdir, slurm_cluster):
    # Every sample is longer than 16 tokens: the SFT trainer refuses the data before step 1 and the job fails.
    r = _chain(workdir, "bad", "--data.seq-len", "16", "--eval.env", "[]")
    assert r.returncode == 0, r.stdout + r.stderr
    sft, rl = workdir / "outputs" / "bad-sft", workdir / "outputs" / "bad-rl"
    (sft_job,), (rl_job,) = _jobs(sft), _jobs(rl)
    s = slurm.wait(sft_job, timeout_s=600, poll_s=2.0)
    assert s.state == "FAILED", _logs(sft)
    assert "data.seq_len = 16" in _logs(sft)
    deadline = time.monotonic() + 120
    while slurm.job_state(rl_job).state not in ("CANCELLED", None) and time.monotonic() < deadline:
        time.sleep(1.0)
    st = slurm.job_state(rl_job)
    assert st.state == "CANCELLED", st
    assert not (rl / "metrics.jsonl").exists()  # it never ran
    status = _srl(workdir, "status", str(rl))
    assert "did not complete successfully" in status.stdout and "nothing of it ran" in status.stdout, status.stdout


def _trainer_steps(run: Path) -> list[int]:
    try:
        lines = (run / "metrics.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return []
    return [m["step"] for m in map(json.loads, filter(str.strip, lines)) if m.get("role") == "trainer"]


def _sft_job(workdir: Path, name: str, *extra: str) -> str:
    r = _srl(
        workdir,
        "sft",
        "@",
        str(REPO / "jobs/reverse-text/sft.toml"),
        "@",
        str(REPO / "jobs/reverse-text/slurm.toml"),
        "--data.name",
        "data/rt.jsonl",
        "--max-steps",
        "40",
        "--data.batch-size",
        "8",
        "--ckpt.interval",
        "5",
        "--val.interval",
        "20",
        "--eval.env",
        "[]",
        "--run.name",
        name,
        *extra,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return _jobs(workdir / "outputs" / name)[-1]


# About 60 s: with the heavy tests (scripts/test.sh -m heavy), to keep CI's whole run under 60 minutes. CI checks
# exact SFT resume locally (test_sft_run.py: stopped and resumed, the same samples per step) and a Slurm requeue
# resuming each step once (test_faults_requeue_slurm.py).
@pytest.mark.heavy
def test_scancelled_sft_job_resumed_trains_exactly_the_uninterrupted_samples(workdir, slurm_cluster):
    """A 2-node SFT job cancelled mid-run (``scancel``: no checkpoint on the way out) and resumed with
    ``srl sft ... --resume`` ends as an uninterrupted twin does: every step recorded once, the same samples per step,
    the same final weights (2 gloo ranks on CPU are deterministic)."""
    twin_job = _sft_job(workdir, "twin")
    s = slurm.wait(twin_job, timeout_s=900, poll_s=2.0)
    twin = workdir / "outputs" / "twin"
    assert s.state == "COMPLETED", _logs(twin)
    assert _trainer_steps(twin) == list(range(1, 41))

    run = workdir / "outputs" / "cut"
    job = _sft_job(workdir, "cut")
    deadline = time.monotonic() + 900
    while max(_trainer_steps(run), default=0) < 12:
        st = slurm.job_state(job)
        assert not st.is_terminal, f"job {job} ended ({st.state}) before step 12:\n{_logs(run)}"
        assert time.monotonic() < deadline, "no trainer step 12 within 900 s"
        time.sleep(0.5)
    slurm.cancel(job)
    assert slurm.wait(job, timeout_s=120, poll_s=0.5).state == "CANCELLED"
    cut_at = max(_trainer_steps(run))
    assert cut_at < 40, "the job finished before it was cancelled: nothing to resume"

    # The lease of the cancelled job expires or is seen dead; the resume takes over and continues from the last
    # complete checkpoint (steps after it are trained again on the same samples, and recorded once).
    deadline = time.monotonic() + 120
    while True:
        r = _srl(
            workdir,
            "sft",
            "@",
            str(REPO / "jobs/reverse-text/sft.toml"),
            "@",
            str(REPO / "jobs/reverse-text/slurm.toml"),
            "--data.name",
            "data/rt.jsonl",
            "--max-steps",
            "40",
            "--data.batch-size",
            "8",
            "--ckpt.interval",
            "5",
            "--val.interval",
            "20",
            "--eval.env",
            "[]",
            "--run.name",
            "cut",
            "--resume",
        )
        if r.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(5)
    assert r.returncode == 0, r.stdout + r.stderr
    resumed = _jobs(run)[-1]
    assert resumed != job
    s = slurm.wait(resumed, timeout_s=900, poll_s=2.0)
    assert s.state == "COMPLETED", _logs(run)
    print(f"\ncancelled at step {cut_at}; resumed as job {resumed}")

    assert _trainer_steps(run) == list(range(1, 41)), "a step lost or recorded twice"
    order = [json.loads(x) for x in (run / "data_order.jsonl").read_text().splitlines() if x.strip()]
    twin_order = [json.loads(x) for x in (twin / "data_order.jsonl").read_text().splitlines() if x.strip()]
    assert order == twin_order
    from safetensors.numpy import load_file

    wa, wb = load_file(twin / "model" / "model.safetensors"), load_file(run / "model" / "model.safetensors")
    assert wa.keys() == wb.keys()
    worst = max(float(abs(wa[k] - wb[k]).max()) for k in wa)
    assert worst < 1e-5, worst
