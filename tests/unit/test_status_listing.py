"""What a newcomer meets after a run (issue 34 items 7 and 8), without a cluster:

- ``srl status`` with no argument lists the runs under the output directory (name, state, step, reward); dry runs
  and the eval gate's report-only directories are not listed as runs. It was a usage error.
- ``srl logs --follow`` ends once the run has ended (its lease released, no Slurm job live), after printing the
  run's last lines. It followed forever.
- A run whose latest attempt recorded how it ended does not show "stop requested" (srl's batch script leaves a
  stop request at every job's end), whatever Slurm says of its job.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from toolkit.config import load_config
from toolkit.launch.prepare import prepare_attempt
from toolkit.launch.progress import progress_lines
from toolkit.run import ending
from toolkit.run.layout import RunDir, point_symlink

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "jobs" / "reverse-text" / "rl.toml"


def _srl(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "toolkit.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _launched(out: Path, name: str):
    """A run directory as a launch leaves it before anything runs: configs of attempt 1 and the run's lease, held
    by this process (the launcher it would become). Returns ``(run, lease)``."""
    from toolkit import lease as leases

    loaded = load_config([JOB], ["--output-dir", str(out), "--run.name", name])
    run, _ = prepare_attempt(loaded, RunDir(out / name), argv=["srl", "rl"], dry_run=False, resume=False, clean=False)
    return run, leases.held(run)


def _record(run: RunDir, step: int, reward: float) -> None:
    with open(run.metrics, "a") as f:
        f.write(
            json.dumps({"role": "orchestrator", "step": step, "reward/all/mean": reward, "time": time.time()}) + "\n"
        )
        f.write(json.dumps({"role": "trainer", "step": step, "time": time.time()}) + "\n")


def test_status_without_argument_lists_runs_not_dry_runs_or_gate_reports(tmp_path: Path) -> None:
    out = tmp_path / "outputs"
    done, lease = _launched(out, "finished-run")
    _record(done, 200, 0.5)
    ending.write(done, ending.Ending(ending.COMPLETED, step=200))
    lease.release()
    live, live_lease = _launched(out, "live-run")
    _record(live, 3, 0.125)
    try:
        dry = _srl("rl", "@", str(JOB), "--output-dir", str(out), "--run.name", "only-dry", "--dry-run", cwd=tmp_path)
        assert dry.returncode == 0, dry.stderr
        (out / "reverse-text-gate" / "reports").mkdir(parents=True)  # what `srl eval validate` leaves
        (out / "reverse-text-gate" / "reports" / "eval_validate.json").write_text("{}")

        r = _srl("status", cwd=tmp_path)
        # The same table for an output directory given by name.
        by_name = _srl("status", str(out), cwd=REPO)
    finally:
        live_lease.release()
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: line.split() for line in r.stdout.splitlines()[2:]}
    assert set(rows) == {"finished-run", "live-run"}, r.stdout
    assert rows["finished-run"][1:] == ["completed", "(exit", "0)", "200/200", "0.5000"]
    assert rows["live-run"][1:] == ["running", "3/200", "0.1250"]
    assert by_name.stdout.splitlines()[1:] == r.stdout.splitlines()[1:]
    assert "dry runs only" in _srl("status", str(out / "only-dry"), cwd=REPO).stdout


def test_status_without_runs_says_where_it_looked(tmp_path: Path) -> None:
    r = _srl("status", cwd=tmp_path)
    assert r.returncode == 1 and "outputs does not exist" in r.stderr and "usage" not in r.stderr


def test_logs_follow_ends_when_the_run_ends(tmp_path: Path) -> None:
    run, lease = _launched(tmp_path, "followed")
    run.log_attempt(1).mkdir(parents=True)
    point_symlink(run.latest_logs, "attempt_1")
    log = run.log_attempt(1) / "orchestrator.log"
    log.write_text("step 1\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "toolkit.cli", "logs", str(run.root), "--follow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline() == "[orchestrator.log] step 1\n"  # following while the lease is held
        with open(log, "a") as f:
            f.write("step 2\n")
        assert proc.stdout.readline() == "[orchestrator.log] step 2\n"
        with open(log, "a") as f:
            f.write("last line\n")
        ending.write(run, ending.Ending(ending.COMPLETED, step=2))
        lease.release()  # the launcher's last act
        out, err = proc.communicate(timeout=120)
    finally:
        lease.release()
        proc.kill()
    assert proc.returncode == 0
    assert out == "[orchestrator.log] last line\n"
    assert "the run has ended" in err


def test_a_run_that_recorded_its_ending_shows_no_pending_stop_request(tmp_path: Path) -> None:
    run, lease = _launched(tmp_path, "stopped")
    lease.release()
    run.control.mkdir(parents=True, exist_ok=True)
    run.stop_request.touch()  # the batch script's stop request at the job's end
    assert any("stop requested" in line for line in progress_lines(run))  # no ending yet: an attempt may act on it
    ending.write(run, ending.Ending(ending.COMPLETED, step=200))
    lines = progress_lines(run, max_steps=200)
    assert not any("stop requested" in line for line in lines), lines
    assert any(line.startswith("ended: ") for line in lines)


def test_a_damaged_job_ids_line_or_a_log_named_directory_is_no_traceback(tmp_path: Path) -> None:
    # A hand-edited job_ids.txt ('123 rl x') made `srl status` (every run of the listing) and `srl logs` raise
    # ValueError; a directory named like a log made `srl logs` raise IsADirectoryError.
    out = tmp_path / "outputs"
    run, lease = _launched(out, "edited")
    ending.write(run, ending.Ending(ending.COMPLETED, step=1))
    lease.release()
    run.job_ids_file.write_text("4242 rl x\n")
    run.log_attempt(1).mkdir(parents=True)
    point_symlink(run.latest_logs, "attempt_1")
    (run.log_attempt(1) / "trainer.log").write_text("step 1\n")
    (run.log_attempt(1) / "odd.log").mkdir()
    listed = _srl("status", "--output-dir", str(out), cwd=tmp_path)
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
    assert listed.stdout.splitlines()[2].split()[:2] == ["edited", "completed"], listed.stdout
    logs = _srl("logs", str(run.root), cwd=tmp_path)
    assert logs.returncode == 0 and "Traceback" not in logs.stderr, logs.stderr
    assert logs.stdout == "step 1\n"


def test_status_of_a_run_names_its_first_run_gates(tmp_path: Path, capsys) -> None:
    from toolkit.launch.control import status_main
    from toolkit.run.verdict import GATE_STEM, VALIDATE_STEM, GateItem, Verdict

    run = RunDir(tmp_path / "gated")
    Verdict("validate", [GateItem("known_failures", "empty-wins", "FAIL", "empty scored 1.0")]).write(
        run.reports, VALIDATE_STEM
    )
    run.gate_run("validate").configs.mkdir(parents=True)  # what the gate's Slurm job leaves
    # No training attempt yet: the gate is what there is to say, not "not a run directory".
    assert status_main([str(run.root)]) == 0
    out = capsys.readouterr().out
    assert "no training attempt yet" in out
    assert (
        "first-run gate, srl eval validate: FAILED (empty-wins/known_failures); its Slurm job: srl status "
        f"{run.gate_run('validate').root}" in out
    )
    assert "srl eval run" not in out  # never run: no line
    # A launched run lists its gates beside its progress.
    Verdict("run", [GateItem("error_rate", "reverse-text", "PASS", "0 of 8")]).write(run.reports, GATE_STEM)
    loaded = load_config([JOB], ["--output-dir", str(tmp_path), "--run.name", "gated"])
    prepare_attempt(loaded, run, argv=["srl", "rl"], dry_run=True, resume=False, clean=False)
    assert status_main([str(run.root)]) == 0
    out = capsys.readouterr().out
    assert "first-run gate, srl eval run: passed\n" in out and "srl eval validate: FAILED" in out


def test_a_gate_job_newer_than_the_verdict_is_not_shown_as_that_verdict(tmp_path: Path, monkeypatch) -> None:
    """Slurm is asked about a gate's newest job only when the newest verdict is not that job's (the verdict records
    its job's attempt); when Slurm does not answer, the line says so instead of showing the old verdict as current.
    (Queued, then cancelled, against real Slurm: test_evalgate_slurm.py.)"""
    from toolkit.launch import control, slurm
    from toolkit.run.verdict import GATE_ATTEMPT, VALIDATE_STEM, GateItem, Verdict

    def no_slurm(job_ids):  # a Slurm that does not answer (a fault the real one gives only when it is down)
        raise slurm.SlurmCommandError(["squeue"], 1, "slurm_load_jobs error: Unable to contact slurm controller")

    monkeypatch.setattr(slurm, "live_jobs", no_slurm)
    run = RunDir(tmp_path / "gated")
    job_dir = run.gate_run("validate")
    job_dir.configs.mkdir(parents=True)
    job_dir.job_ids_file.parent.mkdir(parents=True)
    job_dir.job_ids_file.write_text("101 eval 1\n")
    passed = [GateItem("taskset_loads", "t", "PASS", "ok")]
    Verdict("validate", passed, settings={GATE_ATTEMPT: 1}).write(run.reports, VALIDATE_STEM)
    where = f"; its Slurm job: srl status {job_dir.root}"
    # The newest job wrote the newest verdict: that is the line, and Slurm is not asked.
    assert control.gate_lines(run) == ["first-run gate, srl eval validate: passed" + where]
    # A second gate job (attempt 2) has no verdict yet: only Slurm knows whether it waits or ended.
    job_dir.job_ids_file.write_text("101 eval 1\n102 eval 2\n")
    assert control.gate_lines(run) == [
        "first-run gate, srl eval validate: gate job 102: Slurm did not answer (the previous verdict: passed)" + where
    ]
    # A verdict of a gate run in the login node's own process carries no attempt: nothing to compare, no question.
    Verdict("validate", [GateItem("known_failures", "t", "FAIL", "empty scored 1")]).write(run.reports, VALIDATE_STEM)
    assert control.gate_lines(run) == ["first-run gate, srl eval validate: FAILED (t/known_failures)" + where]
