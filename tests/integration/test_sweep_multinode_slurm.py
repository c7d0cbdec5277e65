"""A sweep of the README's Slurm job on the real local cluster: `srl sweep` over ``rl.toml @ slurm.toml`` (inference
+ orchestrator on one node, a 2-node torchrun trainer: 3 nodes per point), real vLLM CPU engine, tiny model.

Two points (two learning rates), one array of 3-node tasks, ``max_parallel = 1``:
- point p000 gets the pre-timeout signal mid-run (``scancel --batch --signal=USR2`` of its array task, as Slurm sends
  it before the time limit): its job checkpoints and requeues itself; while it waits (Slurm holds a requeued job a
  few seconds) p001 takes the one free slot;
- point p001 is cancelled with a plain ``scancel`` of its array task while it trains (the cluster tracks processes by
  process group, KillWait 5 s): no process of its run is left on any node after KillWait;
- p000 then comes back as the same point, resuming from its checkpoint, and finishes;
- ``srl sweep ... --resume`` (what ``srl cancel`` prints) skips the finished p000 and resumes p001;
- in the end every trainer and orchestrator step of both points is recorded exactly once, ``srl status <sweep>``
  shows both points COMPLETED with p000's requeue, and each task ran on 3 nodes.

Figures (wall time per phase) are printed; run with ``-s``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from toolkit.checkpoints import latest_complete
from toolkit.launch import slurm
from toolkit.launch.submit import read_job_ids
from toolkit.run.layout import RunDir

# heavy: about 7 minutes on two cores (four 3-node job starts, each with a vLLM engine); the sweep arrays, their
# shapes and srl cancel of a sweep run in CI in tests/integration/test_sweep_arrays_slurm.py.
pytestmark = [pytest.mark.slow, pytest.mark.heavy, pytest.mark.slurm, pytest.mark.vllm, pytest.mark.timeout(2400)]

REPO = Path(__file__).resolve().parents[2]
MAX_STEPS, INTERVAL = 6, 2
PREEMPT_AT = 3  # trainer step after which p000 gets the pre-timeout signal (a complete checkpoint exists by then)
KILL_WAIT_S = 5.0  # the local cluster's KillWait
PHASE_S = 900.0  # engine start-up (about a minute on two loaded cores) plus the steps, generous for a busy machine


def _srl(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "toolkit.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _steps(run: RunDir, role: str) -> list[int]:
    out = []
    try:
        lines = run.metrics.read_text().splitlines()
    except FileNotFoundError:
        return []
    for ln in lines:
        try:
            rec = json.loads(ln)
        except ValueError:
            continue
        # eval records (keys eval/...) share the orchestrator's step numbers; only training steps are counted
        if rec.get("role") == role and rec.get("step", 0) >= 1 and not any(k.startswith("eval/") for k in rec):
            out.append(rec["step"])
    return out


def _naming(run: RunDir) -> list[int]:
    """PIDs of processes whose command line names the run directory (every emulated node runs on this machine)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                if str(run.root).encode() in (d / "cmdline").read_bytes():
                    out.append(int(d.name))
            except OSError:
                continue
    return out


def _logs(root: Path) -> str:
    parts = [
        f"---- {p.relative_to(root)}\n{p.read_text(errors='replace')[-2500:]}"
        for p in sorted(root.glob("**/logs/*.out")) + sorted(root.glob("p*/logs/attempt_*/*.log"))
    ]
    return "\n".join(parts)[-20000:]


def _task(run: RunDir) -> str:
    return read_job_ids(run)[-1][0]


def _wait(what: str, cond, root: Path, timeout_s: float = PHASE_S, poll_s: float = 1.0):
    deadline = time.monotonic() + timeout_s
    while True:
        got = cond()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:.0f} s\n{_logs(root)}"
        time.sleep(poll_s)


def test_two_point_sweep_of_3_node_jobs_preempted_cancelled_and_resumed(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep.toml"
    sweep.write_text(f"""[sweep]
name = "mn"
base = ["{REPO}/jobs/reverse-text/rl.toml", "{REPO}/jobs/reverse-text/slurm.toml"]
max_parallel = 1
[sweep.grid]
"trainer.optim.lr" = [5e-4, 1e-3]
""")
    argv = [
        "sweep",
        "@",
        str(sweep),
        "--max-steps",
        str(MAX_STEPS),
        "--ckpt.interval",
        str(INTERVAL),
        "--output-dir",
        str(tmp_path / "out"),
    ]
    t0 = time.monotonic()
    r = _srl(*argv)
    assert r.returncode == 0, r.stdout + r.stderr
    root = tmp_path / "out" / "mn"
    p0, p1 = RunDir(root / "p000"), RunDir(root / "p001")
    (array,) = [json.loads(ln)["job_id"] for ln in (root / "arrays.jsonl").read_text().splitlines()]
    assert (_task(p0), _task(p1)) == (f"{array}_0", f"{array}_1")
    figures = {}
    try:
        # ---- p000: pre-timeout signal mid-run -> checkpoint, requeue; the requeued task waits behind the throttle
        _wait(
            "p000 past step 3 with a checkpoint",
            lambda: max(_steps(p0, "trainer"), default=0) >= PREEMPT_AT and latest_complete(p0) is not None,
            root,
        )
        figures["p000 to step 3"] = time.monotonic() - t0
        st = slurm.job_state(_task(p0))
        assert st.state == "RUNNING" and len(st.node_list) == 3, st
        subprocess.run(["scancel", "--batch", "--signal=USR2", _task(p0)], check=True, timeout=30)
        t1 = time.monotonic()
        _wait("p000 requeued", lambda: slurm.job_state(_task(p0)).restart_count >= 1, root)
        figures["USR2 -> requeued"] = time.monotonic() - t1

        # ---- p001 takes the free slot (max_parallel 1): a plain scancel of its running task leaves nothing of its
        # run behind
        # Polled fast and cancelled at once: the point's later steps take a second or two each, and a cancel that
        # came after its last checkpoint would leave nothing for --resume to do.
        _wait("p001 at step 2", lambda: max(_steps(p1, "trainer"), default=0) >= 2, root, poll_s=0.1)
        st = slurm.job_state(_task(p1))
        assert st.state == "RUNNING" and len(st.node_list) == 3, st
        assert slurm.job_state(_task(p0)).state == "PENDING"  # never two points at once
        assert _naming(p1), "no process of p001's run found while it trains"
        t2 = time.monotonic()
        slurm.cancel(_task(p1))
        cancel_step = max(_steps(p1, "trainer"), default=0)
        slurm.wait(_task(p1), timeout_s=120, poll_s=0.5)
        while _naming(p1) and time.monotonic() - t2 < KILL_WAIT_S + 30:
            time.sleep(0.2)
        left = _naming(p1)
        assert not left, [Path(f"/proc/{p}/cmdline").read_bytes()[:200] for p in left if Path(f"/proc/{p}").exists()]
        figures["scancel -> no process of p001"] = time.monotonic() - t2
        cut = latest_complete(p1)
        assert cut is None or cut < MAX_STEPS, (
            f"p001 finished (checkpoint {cut}) before the cancel at step {cancel_step}"
        )

        # ---- p000 comes back as the same point and finishes from its checkpoint
        t1 = time.monotonic()
        _wait("p000 finished", lambda: slurm.job_state(_task(p0)).state == "COMPLETED", root)
        figures["p000 rerun -> done"] = time.monotonic() - t1

        # ---- srl status, then continue the sweep as srl cancel would print it
        r = _srl("status", str(root))
        assert r.returncode == 0, r.stderr
        rows = {ln.split("\t")[0]: ln.split("\t") for ln in r.stdout.splitlines() if ln.startswith("p00")}
        assert rows["p000"][1] == "COMPLETED" and rows["p000"][4] == f"{array}_0" and rows["p000"][5] == "1", r.stdout
        assert rows["p001"][1] == "CANCELLED", r.stdout
        r = _srl(*argv, "--resume")
        assert r.returncode == 0, r.stdout + r.stderr
        assert "p000: finished" in r.stdout, r.stdout
        assert "p001: finished" not in r.stdout and _task(p1) != f"{array}_1", r.stdout + r.stderr
        t3 = time.monotonic()
        _wait("p001 finished after --resume", lambda: slurm.job_state(_task(p1)).state == "COMPLETED", root)
        figures["p001 resume -> done"] = time.monotonic() - t3
    finally:
        for run in (p0, p1):
            for job, _, _ in read_job_ids(run):
                slurm.cancel(job)

    for run in (p0, p1):
        for role in ("trainer", "orchestrator"):
            steps = _steps(run, role)
            assert sorted(Counter(steps)) == list(range(1, MAX_STEPS + 1)), (run.root.name, role, steps)
            assert all(n == 1 for n in Counter(steps).values()), (run.root.name, role, Counter(steps))
    r = _srl("status", str(root))
    rows = {ln.split("\t")[0]: ln.split("\t") for ln in r.stdout.splitlines() if ln.startswith("p00")}
    assert rows["p000"][1] == rows["p001"][1] == "COMPLETED", r.stdout
    assert rows["p000"][2] == rows["p001"][2] == str(MAX_STEPS), r.stdout
    log = "".join(p.read_text() for p in p0.logs.glob("*.out"))
    assert "restart 0" in log and "restart 1" in log, log[-3000:]
    print(
        "\n"
        + "; ".join(f"{k}: {v:.0f} s" for k, v in figures.items())
        + f"; p001 cancelled at trainer step {cancel_step}; total {time.monotonic() - t0:.0f} s"
    )
