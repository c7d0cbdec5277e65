"""Nothing of a run outlives its local supervisor (real launcher, real trainer, real vLLM; nothing faked).

``kill -9`` of the ``srl`` launcher is what the OOM killer, a node agent or Slurm's KillWait does. Every process of
the run (engine and its engine core, trainer, orchestrator, env workers) must be gone within seconds: the kernel
kills the launcher's direct children (parent-death signal) and the launcher's reaper kills their process groups.
The figures (seconds from the kill until no process of the run is left) are printed (``-s``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from run_records import role_steps, srl_background

from toolkit.procutil import pid_alive, process_start_time

REPO = Path(__file__).resolve().parents[2]
LEFT_AFTER_S = 30.0  # the bound the run is held to; the figures are far below it


def _children_of() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_bytes()
            except OSError:
                continue
            ppid = int(stat[stat.rfind(b")") + 2 :].split()[1])
            out.setdefault(ppid, []).append(int(d.name))
    return out


def tree(pid: int) -> dict[int, int | None]:
    """``pid`` and every descendant, each with its start time (so a reused PID is not taken for it)."""
    kids, todo, seen = _children_of(), [pid], {}
    while todo:
        p = todo.pop()
        if p not in seen:
            seen[p] = process_start_time(p)
            todo += kids.get(p, [])
    return seen


def naming(run: Path) -> dict[int, int | None]:
    """Processes whose command line names the run directory (a re-parented role would still name it)."""
    out = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                if str(run).encode() in (d / "cmdline").read_bytes():
                    out[int(d.name)] = process_start_time(int(d.name))
            except OSError:
                continue
    return out


def seconds_until_gone(procs: dict[int, int | None], timeout_s: float = LEFT_AFTER_S) -> float:
    """Seconds until none of ``procs`` is alive; fails naming the survivors after ``timeout_s``."""
    t0 = time.monotonic()
    while True:
        alive = {p: s for p, s in procs.items() if pid_alive(p, s)}
        if not alive:
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout_s:
            names = {p: Path(f"/proc/{p}/cmdline").read_bytes()[:160] for p in alive if Path(f"/proc/{p}").exists()}
            pytest.fail(f"{len(alive)} process(es) of the run still alive {timeout_s:.0f} s after kill -9: {names}")
        time.sleep(0.1)


def trainer_steps(run: Path) -> list[int]:
    path = run / "metrics.jsonl"
    if not path.exists():
        return []
    return [
        json.loads(x)["step"]
        for x in path.read_text().splitlines()
        if x.strip() and json.loads(x).get("role") == "trainer"
    ]


def wait_for(what: str, cond, proc: subprocess.Popen, timeout_s: float, every_s: float = 0.2) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if proc.poll() is not None:
            pytest.fail(f"launcher exited ({proc.returncode}) before {what}:\n{proc.stdout.read()}")
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        time.sleep(every_s)


def kill_9_and_measure(proc: subprocess.Popen, run: Path) -> float:
    """kill -9 the launcher; return seconds until no process of its tree or naming ``run`` is left."""
    procs = {**tree(proc.pid), **naming(run)}
    procs.pop(proc.pid)
    assert procs, "the launcher has no children to test"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    took = seconds_until_gone(procs)
    late = naming(run)  # started after the snapshot (e.g. a worker spawned at that moment)
    assert not late, late
    return took


@pytest.fixture(scope="module")
def sft_workdir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("sftkill")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "toolkit.cli",
            "sft",
            "make-data",
            "data/rt.jsonl",
            "@",
            str(REPO / "jobs/reverse-text/rl.toml"),
            "--taskset.num-train-examples",
            "200",
        ],
        check=False,
        cwd=d,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    return d


def sft_argv(name: str, steps: int = 200) -> list[str]:
    """A trainer-only SFT run (no online eval, so no engine)."""
    return [
        "sft",
        "@",
        str(REPO / "jobs/reverse-text/sft.toml"),
        "--data.name",
        "data/rt.jsonl",
        "--max-steps",
        str(steps),
        "--ckpt.interval",
        "2",
        "--val.interval",
        "1000",
        "--data.batch-size",
        "8",
        "--eval.env",
        "[]",
        "--run.name",
        name,
    ]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_kill_9_of_the_sft_launcher_mid_training_leaves_no_process(sft_workdir):
    run = sft_workdir / "outputs" / "k9"
    proc = srl_background(*sft_argv("k9"), cwd=sft_workdir)
    wait_for("trainer step 2", lambda: max(trainer_steps(run), default=0) >= 2, proc, 600)
    took = kill_9_and_measure(proc, run)
    print(f"\nSFT launcher kill -9 mid-training: no process of the run left after {took:.1f} s")
    steps = trainer_steps(run)
    time.sleep(3)
    assert trainer_steps(run) == steps, "the run went on training after its supervisor died"


RL_STEPS = 6


def rl_argv(out: Path, *extra: str) -> list[str]:
    return [
        "rl",
        "@",
        str(REPO / "jobs/reverse-text/rl.toml"),
        "--max-steps",
        str(RL_STEPS),
        "--ckpt.interval",
        "2",
        "--output-dir",
        str(out),
        "--run.name",
        "k9",
        *extra,
    ]


def _incomplete_checkpoints(checkpoints: Path) -> set[str]:
    """Checkpoint entries being written: a step's temporary directory, or its directory without COMPLETE."""
    try:
        entries = list(checkpoints.iterdir())
    except FileNotFoundError:
        return set()
    return {
        e.name
        for e in entries
        if e.name.startswith(".step_") or (e.name.startswith("step_") and not (e / "COMPLETE").exists())
    }


def _has_engine(proc: subprocess.Popen) -> bool:
    for p in tree(proc.pid):
        try:
            if b"vllm.entrypoints" in Path(f"/proc/{p}/cmdline").read_bytes():
                return True
        except OSError:
            continue
    return False


@pytest.mark.slow
@pytest.mark.heavy
@pytest.mark.vllm
@pytest.mark.timeout(2400)
def test_rl_kill_9_at_three_moments_leaves_nothing_and_resume_is_refused_while_live(tmp_path):
    """The main job, killed at engine start-up, mid-training and during a checkpoint; --resume refused while the
    launcher lives, accepted after its death, and the run ends with every step recorded exactly once."""
    out = tmp_path / "out"
    run = out / "k9"
    figures = {}

    # 1. kill -9 while vLLM starts (engine process up, not yet ready).
    proc = srl_background(*rl_argv(out), cwd=REPO)
    wait_for("engine process", lambda: _has_engine(proc), proc, 300)
    time.sleep(5)
    assert not (run / "control" / "inference_ready.json").exists(), "engine ready too soon to test its start-up"
    figures["kill -9 at engine start-up: s until no process"] = kill_9_and_measure(proc, run)

    # 2. --resume after that kill works at once (the dead holder's lease is taken over); kill -9 mid-training.
    proc = srl_background(*rl_argv(out, "--resume"), cwd=REPO)
    wait_for("trainer step 3", lambda: max(role_steps(run, "trainer"), default=0) >= 3, proc, 1200)
    rival = subprocess.run(
        [sys.executable, "-m", "toolkit.cli", *rl_argv(out, "--resume")],
        cwd=REPO,
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert rival.returncode == 2, rival.stdout + rival.stderr
    assert f"pid {proc.pid}" in rival.stderr and f"srl cancel {run}" in rival.stderr, rival.stderr
    assert len(list((run / "configs").glob("attempt_*"))) == 2, "a refused --resume must not start an attempt"
    figures["kill -9 mid-training: s until no process"] = kill_9_and_measure(proc, run)
    steps = role_steps(run, "trainer")
    time.sleep(5)
    assert role_steps(run, "trainer") == steps, "the run went on training after its supervisor died"

    # 3. --resume with a checkpoint every step; kill -9 while one is being written (its COMPLETE not yet there).
    left = _incomplete_checkpoints(run / "checkpoints")  # what the kill mid-training left half-written
    proc = srl_background(*rl_argv(out, "--resume", "--ckpt.interval", "1"), cwd=REPO)
    wait_for("a checkpoint in flight", lambda: _incomplete_checkpoints(run / "checkpoints") - left, proc, 1200, 0.005)
    figures["kill -9 during a checkpoint: s until no process"] = kill_9_and_measure(proc, run)

    # 4. --resume to the end: every step exactly once.
    proc = srl_background(*rl_argv(out, "--resume"), cwd=REPO)
    text = proc.communicate(timeout=1500)[0]
    assert proc.returncode == 0, text
    assert "took over the run lease" in text, text
    assert role_steps(run, "trainer") == list(range(1, RL_STEPS + 1))
    assert role_steps(run, "orchestrator", first=1) == list(range(1, RL_STEPS + 1))
    hist = [json.loads(x) for x in (run / "launcher" / "lease_history.jsonl").read_text().splitlines()]
    assert len(hist) == 3 and all("gone" in h["reason"] for h in hist)  # one takeover per killed launcher
    print("\n" + "\n".join(f"{k}: {v:.1f}" for k, v in figures.items()))


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_process_group_kill_after_killwait_leaves_no_process(sft_workdir):
    """What Slurm does to a job step on a site that tracks processes by process group (proctrack/pgid), e.g. to a
    sweep's array task running a local launcher: SIGTERM to the launcher's process group, SIGKILL after KillWait.
    The launcher's children live in process groups of their own, out of reach of both signals."""
    kill_wait_s = 5.0
    run = sft_workdir / "outputs" / "pgkill"
    proc = srl_background(*sft_argv("pgkill"), cwd=sft_workdir)
    wait_for("trainer step 2", lambda: max(trainer_steps(run), default=0) >= 2, proc, 600)
    procs = {**tree(proc.pid), **naming(run)}
    t0 = time.monotonic()
    os.killpg(proc.pid, signal.SIGTERM)
    time.sleep(kill_wait_s)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # the launcher had already stopped the run within KillWait
    proc.wait()
    seconds_until_gone(procs)
    assert not naming(run)
    print(
        f"\nprocess-group TERM, KILL after {kill_wait_s:.0f} s: no process of the run left "
        f"{time.monotonic() - t0:.1f} s after the TERM"
    )
