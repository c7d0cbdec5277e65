"""The run lease (toolkit/lease.py) with real processes: one holder at a time, dead holders taken over (and
logged), a requeued Slurm job takes over its own lease, and of several launches racing for a stale lease from two
emulated nodes exactly one wins (each racer reports the host name a launch on that node would record; they share
one filesystem, as nodes share the run directory)."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import textwrap
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from toolkit import lease
from toolkit.run.layout import RunDir

REPO = Path(__file__).resolve().parents[2]

# A process that takes the lease of RUN and reports; a winner holds it until its stdin closes (it releases it at
# exit). Given a READY file, it creates it once imported and takes the lease only once the GO file exists, so that
# racers start together.
RACER = textwrap.dedent("""
    import socket, sys, time
    from pathlib import Path
    from toolkit import lease
    from toolkit.run.layout import RunDir
    run, host, ready, go = RunDir(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    if host:  # another node: the host name is all that tells nodes apart on a shared filesystem
        socket.gethostname = lambda: host
    if ready:
        Path(ready).touch()
        while not Path(go).exists():
            time.sleep(0.01)
    try:
        l = lease.acquire(run, command="srl racer")
    except lease.LeaseHeld as e:
        print("refused", socket.gethostname(), e.holder.pid, flush=True)
        sys.exit(0)
    print("won", socket.gethostname(), l.holder.pid, flush=True)
    sys.stdin.read()
""")


def _spawn(run: Path, host: str = "", ready: Path | None = None, go: Path | None = None) -> subprocess.Popen:
    argv = [sys.executable, "-c", RACER, str(run), host, str(ready or ""), str(go or "")]
    return subprocess.Popen(
        argv,
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def _report(p: subprocess.Popen, deadline: float) -> list[str]:
    """The line racer ``p`` prints once it has tried for the lease (split); [] when it ended without one."""
    ready, _, _ = select.select([p.stdout], [], [], max(0.0, deadline - time.monotonic()))
    assert ready, f"racer {p.pid} did not report"  # only a hung lease.acquire gets here
    return p.stdout.readline().split()


def _stale(run: RunDir, **over) -> lease.Holder:
    now = time.time()
    h = lease.Holder(
        token="old",
        host="node-z",
        pid=4242,
        pid_start=None,
        job_id=None,
        command="srl rl",
        acquired=now - 600,
        renewed=now - 300,
        expires=now - 255,
    )
    h = lease.Holder(**{**asdict(h), **over})
    run.launcher.mkdir(parents=True, exist_ok=True)
    run.lease_file.write_text(json.dumps(asdict(h)))
    return h


def test_a_live_holder_is_named_and_refuses_others_then_its_death_frees_the_run(tmp_path):
    run = RunDir(tmp_path / "r")
    holder = _spawn(run.root)
    assert holder.stdout.readline().startswith("won")
    with pytest.raises(lease.LeaseHeld) as e:
        lease.acquire(run)
    msg = str(e.value)
    assert f"pid {holder.pid}" in msg and "srl racer" in msg and f"srl cancel {run.root}" in msg
    rec = lease.read(run)
    assert rec.host == os.uname().nodename and rec.pid == holder.pid and rec.expires > time.time()
    holder.kill()
    holder.wait()
    mine = lease.acquire(run)  # same host, PID gone: no need to wait for the expiry
    try:
        assert lease.read(run).token == mine.token
        hist = [json.loads(x) for x in run.lease_history.read_text().splitlines()]
        assert hist[-1]["from"]["pid"] == holder.pid and "gone" in hist[-1]["reason"]
    finally:
        mine.release()
    assert not run.lease_file.exists()


def test_another_hosts_lease_counts_until_it_expires(tmp_path):
    run = RunDir(tmp_path / "r")
    _stale(run, expires=time.time() + 30)  # renewed recently on another node
    with pytest.raises(lease.LeaseHeld, match="node-z"):
        lease.acquire(run)
    _stale(run)  # expired 255 s ago
    got = lease.acquire(run)
    try:
        assert "expired" in json.loads(run.lease_history.read_text().splitlines()[-1])["reason"]
    finally:
        got.release()


def test_a_requeued_job_takes_over_its_own_lease_but_not_another_jobs(tmp_path):
    run = RunDir(tmp_path / "r")
    _stale(run, expires=time.time() + 40, job_id="77")
    with pytest.raises(lease.LeaseHeld, match="Slurm job 77"):
        lease.acquire(run, job_id="78")
    got = lease.acquire(run, job_id="77")
    try:
        assert lease.read(run).job_id == "77" and lease.read(run).token == got.token
    finally:
        got.release()


def test_an_unreadable_lease_file_is_taken_over(tmp_path):
    run = RunDir(tmp_path / "r")
    run.launcher.mkdir(parents=True)
    run.lease_file.write_text("{not json")
    got = lease.acquire(run)
    try:
        rec = lease.read(run)
        assert rec.token == got.holder.token and rec.pid == os.getpid()
        hist = [json.loads(x) for x in run.lease_history.read_text().splitlines()]
        assert len(hist) == 1 and hist[0]["from"]["command"] == "an unreadable lease file", hist
        other = _spawn(run.root)  # taken over for good: another launch is refused, naming this process
        assert other.communicate(timeout=300)[0].split()[::2] == ["refused", str(os.getpid())]
    finally:
        got.release()
    assert not run.lease_file.exists()


def test_launches_from_two_nodes_racing_for_a_stale_lease_exactly_one_wins(tmp_path):
    for round_ in range(3):
        run = RunDir(tmp_path / f"r{round_}")
        _stale(run)
        go = tmp_path / f"go{round_}"
        ready = [tmp_path / f"ready{round_}-{i}" for i in range(8)]
        procs = [_spawn(run.root, f"node-{'ab'[i % 2]}", r, go) for i, r in enumerate(ready)]
        try:
            # Once every racer has imported and waits, the go file lets them hit the lease file together.
            deadline = time.monotonic() + 300  # only a hung racer reaches it
            while not all(r.exists() for r in ready):
                ended = [p.communicate()[1] for p in procs if p.poll() is not None]
                assert not ended and time.monotonic() < deadline, (ended, [r.exists() for r in ready])
                time.sleep(0.05)
            go.touch()
            # Each racer reports once it has tried. A winner holds the lease until every racer has reported (its
            # stdin closed by communicate), so none can find it released and win after it.
            deadline = time.monotonic() + 300
            firsts = [_report(p, deadline) for p in procs]
            rests = [p.communicate(timeout=300) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        outs = [first + rest[0].split() for first, rest in zip(firsts, rests, strict=True)]
        assert all(p.returncode == 0 for p in procs), [rest[1] for rest in rests]
        winners = [o for o in outs if o[0] == "won"]
        assert len(winners) == 1, outs
        # Every loser names the winner (not the stale holder).
        assert all(o[2] == winners[0][2] for o in outs if o[0] == "refused"), outs
        hist = run.lease_history.read_text().splitlines()
        assert len(hist) == 1, hist  # taken over exactly once


def test_renewal_notices_a_takeover_and_a_role_watch_exits(tmp_path, monkeypatch):
    monkeypatch.setattr(lease, "RENEW_S", 0.1)
    monkeypatch.setattr(lease, "WATCH_S", 0.1)
    run = RunDir(tmp_path / "r")
    mine = lease.acquire(run)
    lost: list[str] = []
    gone: list[str] = []
    mine.on_lost(lost.append)
    lease.watch(run, mine.token, gone.append)
    time.sleep(0.5)
    assert not lost and not gone  # renewed, ours
    _stale(
        run,
        token="theirs",
        host=os.uname().nodename,
        pid=os.getppid(),
        pid_start=None,
        expires=time.time() + 60,
        command="srl rl --resume",
    )  # another launch took it
    deadline = time.time() + 5
    while (not lost or not gone) and time.time() < deadline:
        time.sleep(0.05)
    assert lost and "srl rl --resume" in lost[0]
    assert gone and "belongs to" in gone[0]
    mine.release()
    assert lease.read(run).token == "theirs"  # a lost lease is never deleted by its former holder


def test_a_takeover_written_while_a_renewal_syncs_its_record_is_kept(tmp_path, monkeypatch):
    """A renewal reads the record (ours), then writes and syncs its new one; another launch's record written in
    between once got overwritten by the renewal, so a role of the old run never saw the takeover. The takeover is
    injected into the sync, the slow step on a loaded filesystem."""
    run = RunDir(tmp_path / "r")
    mine = lease.acquire(run)
    real_fsync = os.fsync

    def fsync_meanwhile_taken_over(fd):
        monkeypatch.setattr(lease.os, "fsync", real_fsync)
        _stale(
            run,
            token="theirs",
            host=os.uname().nodename,
            pid=os.getppid(),
            pid_start=None,
            expires=time.time() + 60,
            command="srl rl --resume",
        )
        real_fsync(fd)

    monkeypatch.setattr(lease.os, "fsync", fsync_meanwhile_taken_over)
    with pytest.raises(lease.LeaseLost, match="srl rl --resume"):
        mine.renew()
    assert lease.read(run).token == "theirs"
    assert not list(run.launcher.glob(".lease.*.tmp"))
    mine.release()
    assert lease.read(run).token == "theirs"


def test_a_role_started_under_a_lease_exits_when_its_supervisor_dies(tmp_path):
    run = RunDir(tmp_path / "r")
    sup = _spawn(run.root)
    assert sup.stdout.readline().startswith("won")
    token = lease.read(run).token
    role = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
        import time
        from toolkit import lease
        from toolkit.run.layout import RunDir
        lease.WATCH_S = 0.2
        lease.exit_when_lease_gone(RunDir({str(run.root)!r}), "trainer")
        print("watching", flush=True)
        time.sleep(60)
    """),
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), lease.LEASE_ENV: token},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert role.stdout.readline() == "watching\n"  # imported and watching, however slowly it started
    time.sleep(1.0)  # several looks at the lease
    assert role.poll() is None  # supervisor alive: the role runs
    sup.kill()
    sup.wait()
    t0 = time.monotonic()
    assert role.wait(timeout=50) == 3
    assert time.monotonic() - t0 < 30  # the role itself would sleep on for 60 s
    assert "is dead" in role.stderr.read()


def test_srl_rl_and_resume_are_refused_while_a_live_supervisor_holds_the_run(tmp_path, capsys):
    from toolkit.cli import main

    out = tmp_path / "out"
    run = RunDir(out / "held")
    holder = _spawn(run.root)
    assert holder.stdout.readline().startswith("won")
    try:
        for extra in ([], ["--resume"], ["--clean"]):
            rc = main(
                [
                    "rl",
                    "@",
                    str(REPO / "jobs/reverse-text/rl.toml"),
                    "--output-dir",
                    str(out),
                    "--run.name",
                    "held",
                    *extra,
                ]
            )
            err = capsys.readouterr().err
            assert rc == 2, err
            assert f"pid {holder.pid}" in err and f"srl cancel {run.root}" in err, err
            assert not run.configs.exists()  # nothing written, nothing deleted
        assert lease.read(run).pid == holder.pid
    finally:
        holder.kill()
        holder.wait()


def test_srl_cancel_stops_a_local_supervisor_and_status_names_it(tmp_path, capsys):
    from toolkit.launch.control import cancel_main, status_main

    run = RunDir(tmp_path / "r")
    run.configs.mkdir(parents=True)
    holder = _spawn(run.root)
    assert holder.stdout.readline().startswith("won")
    assert status_main([str(run.root)]) == 0
    assert f"supervised by srl racer (pid {holder.pid}" in capsys.readouterr().out
    assert cancel_main([str(run.root)]) == 0
    assert f"asked the launcher (pid {holder.pid})" in capsys.readouterr().out
    assert holder.wait(timeout=10) == -15  # SIGTERM: the launcher's own stop path (checkpoint, then stop)


OWNER = textwrap.dedent("""
    import sys, time
    from toolkit import lease
    from toolkit.run.layout import RunDir
    try:
        l = lease.acquire_policy_owner(RunDir(sys.argv[1]), RunDir(sys.argv[2]), command="srl orchestrator")
    except lease.LeaseHeld as e:
        print("refused", e, flush=True)
        sys.exit(0)
    print("won", flush=True)
    time.sleep(60)
""")


def _owner(deployment: Path, run: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", OWNER, str(deployment), str(run)],
        cwd=REPO,
        text=True,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def test_a_deployment_serves_one_policy_owner_and_a_second_run_is_refused_naming_the_first(tmp_path, capsys):
    dep = tmp_path / "serve"
    a = _owner(dep, tmp_path / "out" / "run-a")
    assert a.stdout.readline().strip() == "won"
    try:
        b = _owner(dep, tmp_path / "out" / "run-b")
        line = b.communicate(timeout=30)[0]
        assert line.startswith("refused"), line
        assert f"inference deployment {dep} already serves the weights of run {tmp_path / 'out' / 'run-a'}" in line
        assert f"srl cancel {tmp_path / 'out' / 'run-a'}" in line and f"pid {a.pid}" in line
        owner = lease.read_policy_owner(RunDir(dep))
        assert owner.pid == a.pid and owner.run == str(tmp_path / "out" / "run-a")

        # srl rl refuses the second run before it starts anything (its orchestrator would be refused anyway).
        from toolkit.cli import main

        rc = main(
            [
                "rl",
                "@",
                str(REPO / "jobs/reverse-text/rl.toml"),
                "--output-dir",
                str(tmp_path / "out"),
                "--run.name",
                "run-b",
                "--inference.external",
                str(dep),
            ]
        )
        err = capsys.readouterr().err
        assert rc == 2 and "already serves the weights of run" in err, err
        assert not (tmp_path / "out" / "run-b" / "configs").exists()
    finally:
        a.kill()
        a.wait()
    # Its owner dead, the deployment takes a new one (and logs the takeover).
    c = _owner(dep, tmp_path / "out" / "run-b")
    try:
        assert c.stdout.readline().strip() == "won"
        hist = [json.loads(x) for x in RunDir(dep).lease_history.read_text().splitlines()]
        assert hist[-1]["event"] == "policy owner takeover" and hist[-1]["from"]["pid"] == a.pid
    finally:
        c.kill()
        c.wait()


def test_clean_keeps_the_launchs_own_lease_while_it_deletes_the_run(tmp_path, monkeypatch):
    from toolkit.config import load_config
    from toolkit.launch.prepare import prepare_run

    monkeypatch.setattr(lease, "RENEW_S", 0.01)  # renewals race the deletion as often as they can
    over = ["--output-dir", str(tmp_path / "out"), "--run.name", "c"]
    run, _ = prepare_run(load_config([REPO / "jobs/reverse-text/rl.toml"], over), argv=["srl", "rl"])
    lease.held(run).release()
    for _ in range(5):
        again, attempt = prepare_run(
            load_config([REPO / "jobs/reverse-text/rl.toml"], over), argv=["srl", "rl"], clean=True
        )
        mine = lease.held(again)
        time.sleep(0.05)
        assert attempt == 1 and mine is not None and mine.lost is None
        assert lease.read(again).token == mine.token
        mine.release()


def test_a_run_with_a_queued_slurm_job_is_refused_until_the_job_is_cancelled(tmp_path, monkeypatch):
    """A queued (or requeued, pending) job holds no lease yet; a second launch is refused naming it."""
    from toolkit.config import ConfigError, load_config
    from toolkit.launch.prepare import prepare_run

    over = ["--output-dir", str(tmp_path / "out"), "--run.name", "q"]
    run, _ = prepare_run(load_config([REPO / "jobs/reverse-text/rl.toml"], over), argv=["srl", "rl"])
    lease.held(run).release()
    (run.launcher / "rl.sbatch").write_text("#!/bin/bash\n")  # it was submitted once
    bindir = tmp_path / "bin"
    bindir.mkdir()
    queued = tmp_path / "queued"
    queued.write_text(f"4711|{run.root}|{run.root}/logs/q-4711.out|{run.root}/logs/q-4711.out|\n")
    (bindir / "squeue").write_text(f"#!/bin/sh\ncat {queued}\n")
    (bindir / "squeue").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    with pytest.raises(ConfigError) as e:
        prepare_run(load_config([REPO / "jobs/reverse-text/rl.toml"], over), argv=["srl", "rl"], resume=True)
    msg = e.value.render()
    assert "Slurm job(s) 4711 queued or running" in msg and f"srl cancel {run.root}" in msg, msg
    assert lease.read(run) is None and run.attempts() == [1]  # the refused launch left nothing behind
    queued.write_text("")  # cancelled
    again, attempt = prepare_run(
        load_config([REPO / "jobs/reverse-text/rl.toml"], over), argv=["srl", "rl"], resume=True
    )
    assert attempt == 2
    lease.held(again).release()
