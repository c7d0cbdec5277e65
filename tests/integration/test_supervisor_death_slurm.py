"""On the real local Slurm cluster (proctrack/pgid, KillWait 5 s): a running job holds its run's lease, a
``--resume`` from the login node meanwhile is refused naming the job, and ``scancel`` leaves no process of the run
on any node once KillWait is over (a 2-node torchrun SFT job; every emulated node runs on this machine, so one
look at /proc sees them all)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from toolkit import lease
from toolkit.launch import slurm
from toolkit.launch.submit import read_job_ids
from toolkit.run.layout import RunDir

pytestmark = [pytest.mark.slow, pytest.mark.slurm, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
KILL_WAIT_S = 5.0  # the local cluster's KillWait


def _srl(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "toolkit.cli", *args],
        cwd=cwd,
        text=True,
        capture_output=True,
        check=False,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        timeout=600,
    )


def _naming(run: Path) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                if str(run).encode() in (d / "cmdline").read_bytes():
                    out.append(int(d.name))
            except OSError:
                continue
    return out


def _trainer_steps(run: Path) -> list[int]:
    try:
        lines = (run / "metrics.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return []
    return [json.loads(x)["step"] for x in lines if x.strip() and json.loads(x).get("role") == "trainer"]


def test_scancel_leaves_no_process_and_a_resume_meanwhile_is_refused(tmp_path, slurm_cluster):
    r = _srl(
        tmp_path,
        "sft",
        "make-data",
        "data/rt.jsonl",
        "@",
        str(REPO / "jobs/reverse-text/rl.toml"),
        "--taskset.num-train-examples",
        "200",
    )
    assert r.returncode == 0, r.stderr
    argv = [
        "sft",
        "@",
        str(REPO / "jobs/reverse-text/sft.toml"),
        "@",
        str(REPO / "jobs/reverse-text/slurm.toml"),
        "--data.name",
        "data/rt.jsonl",
        "--max-steps",
        "400",
        "--data.batch-size",
        "8",
        "--val.interval",
        "1000",
        "--ckpt.interval",
        "1000",
        "--eval.env",
        "[]",
        "--run.name",
        "sc",
    ]
    r = _srl(tmp_path, *argv)
    assert r.returncode == 0, r.stdout + r.stderr
    run = tmp_path / "outputs" / "sc"
    (job,) = [j for j, _k, _a in read_job_ids(RunDir(run))]
    deadline = time.monotonic() + 900
    while max(_trainer_steps(run), default=0) < 2:
        st = slurm.job_state(job)
        assert not st.is_terminal, f"job {job} ended ({st.state}) before step 2:\n" + "\n".join(
            p.read_text()[-3000:] for p in run.glob("logs/**/*") if p.is_file()
        )
        assert time.monotonic() < deadline, "no trainer step 2 within 900 s"
        time.sleep(1)
    holder = lease.read(RunDir(run))
    assert holder is not None and holder.job_id == job and holder.dead_reason() is None

    r = _srl(tmp_path, *argv, "--resume")
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"Slurm job {job}" in r.stderr and f"srl cancel {run}" in r.stderr, r.stderr

    assert _naming(run), "no process of the running job found"
    t0 = time.monotonic()
    slurm.cancel(job)
    slurm.wait(job, timeout_s=120, poll_s=0.5)
    while _naming(run) and time.monotonic() - t0 < KILL_WAIT_S + 30:
        time.sleep(0.2)
    left = _naming(run)
    assert not left, [Path(f"/proc/{p}/cmdline").read_bytes()[:200] for p in left if Path(f"/proc/{p}").exists()]
    print(
        f"\nscancel: no process of the run left {time.monotonic() - t0:.1f} s after it (KillWait {KILL_WAIT_S:.0f} s)"
    )
    steps = _trainer_steps(run)
    time.sleep(3)
    assert _trainer_steps(run) == steps
