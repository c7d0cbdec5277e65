"""A trainer or orchestrator started under one lease stops at once when the run's lease now belongs to another
supervisor (real role processes; the takeover is a real lease record of a live process, as a second launch
writes it). A leftover role must never write into a run that another attempt owns."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from dataclasses import asdict
from pathlib import Path

import pytest
from run_records import role_steps

from toolkit import lease
from toolkit.run.layout import RunDir

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]


def _role(role: str, run: RunDir, token: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "toolkit.cli", role, "--run-dir", str(run.root)],
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1", lease.LEASE_ENV: token},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _env_workers_of(pid: int) -> list[int]:
    """PIDs of live env worker processes started by process ``pid`` (their command line names it)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if "toolkit.envs.server" in argv and "--parent-pid" in argv:
            i = argv.index("--parent-pid")
            if argv[i + 1 : i + 2] == [str(pid)]:
                out.append(int(d.name))
    return out


def _take_over(run: RunDir) -> None:
    """What a second launch's record looks like: a live process on this host (this test), a fresh expiry."""
    now = time.time()
    rec = lease.Holder(
        token=uuid.uuid4().hex,
        host=os.uname().nodename,
        pid=os.getpid(),
        pid_start=None,
        job_id=None,
        command="srl rl --resume",
        acquired=now,
        renewed=now,
        expires=now + 600,
    )
    tmp = run.lease_file.with_name("lease.json.test")
    tmp.write_text(json.dumps(asdict(rec)))
    os.replace(tmp, run.lease_file)


def _exits_within(proc: subprocess.Popen, seconds: float) -> tuple[int, str, float]:
    t0 = time.monotonic()
    try:
        out, _ = proc.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"the role ran on under a foreign lease for {seconds} s:\n{proc.communicate()[0][-3000:]}")
    return proc.returncode, out, time.monotonic() - t0


def test_a_training_sft_trainer_exits_when_the_lease_is_taken_by_another_supervisor(tmp_path):
    from toolkit.commands.sft import load, prepare
    from toolkit.config.cli_args import split_config_args

    data = tmp_path / "d.jsonl"
    data.write_text(
        "".join(
            json.dumps({"prompt": f"Reverse: {w}", "completion": w[::-1]}) + "\n"
            for w in ("abc", "hello", "lease", "srl", "trainer", "tokens") * 20
        )
    )
    args = [
        "@",
        str(REPO / "jobs/reverse-text/sft.toml"),
        "--data.name",
        str(data),
        "--max-steps",
        "500",
        "--data.batch-size",
        "4",
        "--val.interval",
        "1000",
        "--ckpt.interval",
        "1000",
        "--eval.env",
        "[]",
        "--output-dir",
        str(tmp_path / "out"),
        "--run.name",
        "fl",
    ]
    files, overrides, _ = split_config_args(args)
    _view, run, _attempt = prepare(
        load(files, overrides), ["sft", *args], files=files, dry_run=False, resume=False, clean=False
    )
    mine = lease.held(run)  # this test is the supervisor: lease A
    trainer = _role("trainer", run, mine.token)
    deadline = time.monotonic() + 300
    while max(role_steps(run.root, "trainer"), default=0) < 2:
        assert trainer.poll() is None, trainer.communicate()[0][-3000:]
        assert time.monotonic() < deadline, "the trainer did not reach step 2"
        time.sleep(0.2)
    _take_over(run)
    rc, out, took = _exits_within(trainer, 3 * lease.WATCH_S)
    assert rc == 3, out[-3000:]
    assert "the run now belongs to srl rl --resume" in out
    steps = role_steps(run.root, "trainer")
    time.sleep(1)
    assert role_steps(run.root, "trainer") == steps
    assert steps[-1] < 500
    print(f"\ntrainer stopped {took:.1f} s after the takeover (after step {steps[-1]})")
    mine.release()


def test_an_orchestrator_exits_when_the_lease_is_taken_by_another_supervisor(tmp_path):
    from toolkit.config import load_config
    from toolkit.launch.prepare import prepare_run

    loaded = load_config(
        [REPO / "jobs/reverse-text/rl.toml"], ["--output-dir", str(tmp_path / "out"), "--run.name", "fo"]
    )
    run, _ = prepare_run(loaded, argv=["srl", "rl"])
    mine = lease.held(run)
    orch = _role("orchestrator", run, mine.token)
    # Its env workers (started with --parent-pid <orchestrator>) show that it is past its lease watch's start and
    # waiting for inference that never comes (nothing else is started), however slowly it imported.
    deadline = time.monotonic() + 300
    while not _env_workers_of(orch.pid):
        assert orch.poll() is None, orch.communicate()[0][-3000:]
        assert time.monotonic() < deadline, "the orchestrator started no env worker in 300 s"
        time.sleep(0.2)
    _take_over(run)
    # Without the takeover it would wait for inference for startup_timeout_s (15 minutes): exiting within two
    # minutes is the lease's doing (a lease look comes every WATCH_S; the rest is slack for a loaded machine).
    rc, out, took = _exits_within(orch, 120)
    assert rc == 3 and "the run now belongs to srl rl --resume" in out, out[-3000:]
    print(f"\norchestrator stopped {took:.1f} s after the takeover")
    mine.release()


def test_an_orchestrator_refuses_a_deployment_that_serves_another_runs_weights(tmp_path):
    """The launch-time check has a window (two launches at once); the orchestrator's own lease closes it."""
    from toolkit.config import load_config
    from toolkit.launch.prepare import prepare_run

    dep = RunDir(tmp_path / "serve")
    loaded = load_config(
        [REPO / "jobs/reverse-text/rl.toml"],
        ["--output-dir", str(tmp_path / "out"), "--run.name", "late", "--inference.external", str(dep.root)],
    )
    run, _ = prepare_run(loaded, argv=["srl", "rl"])
    first = RunDir(tmp_path / "out" / "first")
    owner = lease.acquire_policy_owner(dep, first, command="srl orchestrator")  # the other run got there first
    orch = _role("orchestrator", run, lease.held(run).token)
    rc, out, _ = _exits_within(orch, 120)
    assert rc == 2, out[-3000:]
    assert f"already serves the weights of run {first.root}" in out and f"srl cancel {first.root}" in out
    assert lease.read_policy_owner(dep).token == owner.token
    owner.release()
    lease.held(run).release()
