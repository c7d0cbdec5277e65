"""Hostile inputs for the dry-run takeover: a directory is replaced by the next run of the same name only when it
holds nothing but what dry runs write. Anything a launched job, a user or a half-finished write left keeps it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from toolkit.launch.prepare import DRY_RUN_MARKER, only_dry_runs
from toolkit.run.layout import RunDir

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "jobs" / "reverse-text" / "rl.toml"
SERVE = ROOT / "jobs" / "serve" / "tiny.toml"
# A fresh interpreter per command; a first dry run with a cold cache imports verifiers, slow on a busy machine. Only
# a hung command reaches this bound.
CLI_TIMEOUT_S = 300


def srl(*args):
    return subprocess.run(
        [sys.executable, "-m", "toolkit.cli", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )


@pytest.fixture(scope="module")
def dry_template(tmp_path_factory) -> Path:
    """One Slurm-site dry run (configs, placement, rendered sbatch script, site copy), copied by each test."""
    out = tmp_path_factory.mktemp("template")
    r = srl("rl", "@", JOB, "--dry-run", "--output-dir", out, "--run.name", "r", "--site", "local-slurm")
    assert r.returncode == 0, r.stderr
    assert (out / "r" / "launcher" / "rl.sbatch").exists()
    return out / "r"


def _copy(template: Path, dest: Path) -> RunDir:
    shutil.copytree(template, dest, symlinks=True)
    return RunDir(dest)


def test_a_pure_dry_run_directory_is_recognised(dry_template, tmp_path):
    assert only_dry_runs(_copy(dry_template, tmp_path / "r"))


# What a job started from a dry run's batch script by hand (or anything else that ran) leaves behind.
LEFT_BY_A_RUN = [
    "logs/r-123.out",
    "logs/attempt_1/trainer.log",
    "rollouts/step_0/READY",
    "broadcasts/step_1/STABLE",
    "checkpoints/step_1/COMPLETE",
    "store/rollouts.h5",
    "control/STOP",
    "control/inference_ready.json",
    "reports/summary.md",
    "launcher/job_ids.txt",
    "launcher/admin_token",
    "launcher/local.json",
    "metrics.jsonl",
    "policy_reloads.jsonl",
    "scratch/kv/0",
    "notes.txt",
    "configs/README",
]


@pytest.mark.parametrize("rel", LEFT_BY_A_RUN)
def test_anything_a_run_or_a_user_left_keeps_the_directory(dry_template, tmp_path, rel):
    run = _copy(dry_template, tmp_path / "r")
    (run.root / rel).parent.mkdir(parents=True, exist_ok=True)
    (run.root / rel).write_text("x")
    assert not only_dry_runs(run)


def test_a_hand_submitted_dry_run_script_whose_job_logged_is_not_deleted(dry_template, tmp_path):
    run = _copy(dry_template, tmp_path / "r")
    (run.logs / "r-4242.out").write_text("srl: starting trainer\n")
    refused = srl("rl", "@", JOB, "--dry-run", "--output-dir", tmp_path, "--run.name", "r", "--site", "local-slurm")
    assert refused.returncode == 2 and "--resume" in refused.stderr and "Traceback" not in refused.stderr
    assert (run.logs / "r-4242.out").read_text() == "srl: starting trainer\n"


@pytest.mark.parametrize(
    "case",
    [
        "half_written_attempt",
        "attempt_is_a_symlink",
        "latest_points_outside",
        "latest_missing",
        "marker_is_a_directory",
        "data_dir_is_a_symlink",
        "empty_configs",
    ],
)
def test_odd_configs_are_never_taken_as_dry(dry_template, tmp_path, case):
    run = _copy(dry_template, tmp_path / "r")
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(run.config_attempt(1), elsewhere / "attempt_9")
    if case == "half_written_attempt":  # a real attempt stopped after its inputs, before anything else
        (run.config_attempt(2) / "inputs").mkdir(parents=True)
    elif case == "attempt_is_a_symlink":
        os.symlink(elsewhere / "attempt_9", run.config_attempt(2))
    elif case == "latest_points_outside":
        run.latest_configs.unlink()
        os.symlink(elsewhere / "attempt_9", run.latest_configs)
    elif case == "latest_missing":
        run.latest_configs.unlink()
    elif case == "marker_is_a_directory":
        (run.config_attempt(1) / DRY_RUN_MARKER).unlink()
        (run.config_attempt(1) / DRY_RUN_MARKER).mkdir()
    elif case == "data_dir_is_a_symlink":  # checkpoints kept on another filesystem
        run.checkpoints.rmdir()
        (elsewhere / "ckpt").mkdir()
        os.symlink(elsewhere / "ckpt", run.checkpoints)
    elif case == "empty_configs":
        shutil.rmtree(run.config_attempt(1))
        run.latest_configs.unlink()
    assert not only_dry_runs(run)
    assert (elsewhere / "attempt_9" / DRY_RUN_MARKER).exists()


def test_a_symlinked_run_directory_is_taken_over_and_cleaned_without_a_traceback(tmp_path):
    real = tmp_path / "scratch" / "r"
    real.parent.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    assert srl("rl", "@", JOB, "--dry-run", "--output-dir", real.parent, "--run.name", "r").returncode == 0
    os.symlink(real, out / "r")
    again = srl("rl", "@", JOB, "--dry-run", "--output-dir", out, "--run.name", "r", "--max-steps", "7")
    assert again.returncode == 0, again.stderr
    assert (out / "r").is_symlink() and (real / "configs" / "attempt_1" / DRY_RUN_MARKER).exists()
    # A launched run behind the link: refused without --clean; with --clean emptied (the link stays), no traceback.
    (real / "metrics.jsonl").write_text('{"step": 1}\n')
    refused = srl("rl", "@", JOB, "--dry-run", "--output-dir", out, "--run.name", "r")
    assert refused.returncode == 2 and (real / "metrics.jsonl").exists()
    assert only_dry_runs(RunDir(out / "r")) is False
    from toolkit.config import load_config
    from toolkit.launch.prepare import prepare_run

    loaded = load_config([JOB], ["--output-dir", str(out), "--run.name", "r"])
    _, attempt = prepare_run(loaded, argv=["srl", "rl"], clean=True)
    assert attempt == 1 and (out / "r").is_symlink() and not (real / "metrics.jsonl").exists()


@pytest.mark.parametrize("cmd,job", [("rl", JOB), ("inference", SERVE)])
def test_resume_with_clean_is_refused_and_deletes_nothing(tmp_path, cmd, job):
    assert srl(cmd, "@", job, "--dry-run", "--output-dir", tmp_path, "--run.name", "r").returncode == 0
    (tmp_path / "r" / "metrics.jsonl").write_text('{"step": 1}\n')
    # Only with --dry-run: the refusal comes before the dry-run branch, and a regression must not launch a real
    # local run from a unit test (one did, while this test was written, and kept two vLLM servers running).
    r = srl(cmd, "@", job, "--output-dir", tmp_path, "--run.name", "r", "--resume", "--clean", "--dry-run")
    assert r.returncode == 2 and "contradict" in r.stderr and "Traceback" not in r.stderr
    assert (tmp_path / "r" / "metrics.jsonl").exists()
    assert not (tmp_path / ".dry-run").exists()


def test_prepare_run_refuses_resume_with_clean_before_touching_anything(tmp_path):
    from toolkit.config import ConfigError, load_config
    from toolkit.launch.prepare import prepare_run

    assert srl("rl", "@", JOB, "--dry-run", "--output-dir", tmp_path, "--run.name", "r").returncode == 0
    (tmp_path / "r" / "metrics.jsonl").write_text('{"step": 1}\n')
    loaded = load_config([JOB], ["--output-dir", str(tmp_path), "--run.name", "r"])
    with pytest.raises(ConfigError, match="contradict"):
        prepare_run(loaded, argv=["srl", "rl"], resume=True, clean=True)
    assert (tmp_path / "r" / "metrics.jsonl").exists()


@pytest.mark.parametrize("flag", ["--clean", "--resume"])
def test_inference_dry_run_of_a_live_deployment_changes_nothing(tmp_path, flag):
    assert srl("inference", "@", SERVE, "--output-dir", tmp_path, "--run.name", "s", "--dry-run").returncode == 0
    live = tmp_path / "s"
    (live / "configs" / "attempt_1" / DRY_RUN_MARKER).unlink()  # as if it had been launched ...
    (live / "logs" / "attempt_1").mkdir()
    (live / "logs" / "attempt_1" / "inference-0-0.log").write_text("serving\n")  # ... and is serving
    before = {p.relative_to(live): p.stat().st_mtime_ns for p in live.rglob("*")}
    r = srl("inference", "@", SERVE, "--output-dir", tmp_path, "--run.name", "s", "--dry-run", flag)
    assert r.returncode == 0, r.stderr
    assert "nothing in it is changed" in r.stdout
    assert {p.relative_to(live): p.stat().st_mtime_ns for p in live.rglob("*")} == before
    assert (tmp_path / ".dry-run" / "s" / "launcher" / "placement.json").exists()


def _failing_squeue(bin_dir: Path) -> dict[str, str]:
    # Fault injection: a login node whose controller does not answer (the real squeue fails the same way here when
    # no test cluster runs, but whether one runs is not this test's choice).
    bin_dir.mkdir()
    fake = bin_dir / "squeue"
    fake.write_text("#!/bin/sh\necho 'slurm_load_jobs error: Unable to contact slurm controller' >&2\nexit 1\n")
    fake.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}


def test_a_dry_run_directory_is_kept_when_slurm_cannot_say_whether_its_script_was_queued(dry_template, tmp_path):
    run = _copy(dry_template, tmp_path / "out" / "r")
    before = sorted(p.relative_to(run.root) for p in run.root.rglob("*"))
    env = _failing_squeue(tmp_path / "bin")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "toolkit.cli",
            "rl",
            "@",
            str(JOB),
            "--dry-run",
            "--output-dir",
            str(tmp_path / "out"),
            "--run.name",
            "r",
            "--site",
            "local-slurm",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=CLI_TIMEOUT_S,
        check=False,
        env=env,
    )
    assert r.returncode != 0
    assert "squeue could not say" in r.stderr and "--clean" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert sorted(p.relative_to(run.root) for p in run.root.rglob("*")) == before  # nothing touched
    # --clean is the user's explicit word: it replaces the directory without asking Slurm.
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "toolkit.cli",
            "rl",
            "@",
            str(JOB),
            "--dry-run",
            "--clean",
            "--output-dir",
            str(tmp_path / "out"),
            "--run.name",
            "r",
            "--site",
            "local-slurm",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=CLI_TIMEOUT_S,
        check=False,
        env=env,
    )
    assert r.returncode == 0, r.stderr


def test_a_local_dry_run_directory_is_taken_over_without_asking_slurm(tmp_path):
    # No batch script was rendered, so nothing can have been submitted: a broken squeue must not matter.
    env = _failing_squeue(tmp_path / "bin")
    for _ in range(2):
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "toolkit.cli",
                "rl",
                "@",
                str(JOB),
                "--dry-run",
                "--output-dir",
                str(tmp_path / "out"),
                "--run.name",
                "r",
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=CLI_TIMEOUT_S,
            check=False,
            env=env,
        )
        assert r.returncode == 0, r.stderr
    assert not list((tmp_path / "out" / "r" / "launcher").glob("*.sbatch"))


def _squeue_printing(bin_dir: Path, body: bytes) -> dict[str, str]:
    # Fault injection: outputs the real squeue cannot be made to print on demand (junk with exit status 0, log
    # paths of another job that are not UTF-8).
    bin_dir.mkdir()
    fake = bin_dir / "squeue"
    fake.write_bytes(b"#!/bin/sh\n" + body)
    fake.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}


@pytest.mark.parametrize("case", ["junk-exit-0", "not-utf8"])
def test_a_dry_run_directory_is_kept_when_squeue_output_is_odd(dry_template, tmp_path, case):
    run = _copy(dry_template, tmp_path / "out" / "r")
    before = sorted(p.relative_to(run.root) for p in run.root.rglob("*"))
    logs = os.fsencode(run.logs)
    body = {
        # A controller error on stdout with exit 0 is no empty queue.
        "junk-exit-0": b"echo 'slurm_load_jobs error: Unable to contact slurm controller'\n",
        # Another job's log path is not UTF-8; the dry run's script, submitted by hand, is still pending.
        "not-utf8": b"printf '%s\\n' '5|/w|/data/\xfe%j.out|/data/\xfe%j.out|' '6|/w|"
        + logs
        + b"/r-%j.out|"
        + logs
        + b"/r-%j.out|'\n",
    }[case]
    env = _squeue_printing(tmp_path / "bin", body)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "toolkit.cli",
            "rl",
            "@",
            str(JOB),
            "--dry-run",
            "--output-dir",
            str(tmp_path / "out"),
            "--run.name",
            "r",
            "--site",
            "local-slurm",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=CLI_TIMEOUT_S,
        check=False,
        env=env,
    )
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    want = "squeue could not say" if case == "junk-exit-0" else "Slurm job(s) 6 submitted from it"
    assert want in r.stderr, r.stderr
    assert sorted(p.relative_to(run.root) for p in run.root.rglob("*")) == before  # nothing touched


def test_the_shadow_of_a_dry_run_of_an_existing_run_is_kept_while_slurm_cannot_say(dry_template, tmp_path):
    # A dry run of an existing run writes to <output_dir>/.dry-run/<name>; its batch script may be submitted by hand
    # too, so the next such dry run must not delete that directory while Slurm cannot say the job is gone.
    out = tmp_path / "out"
    _copy(dry_template, out / "r")
    (out / "r" / "logs" / "r-1.out").write_text("a launched run\n")  # the live run: not a dry run any more
    args = (
        "rl",
        "@",
        str(JOB),
        "--dry-run",
        "--resume",
        "--output-dir",
        str(out),
        "--run.name",
        "r",
        "--site",
        "local-slurm",
    )
    first = srl(*args)
    assert first.returncode == 0, first.stderr
    shadow = out / ".dry-run" / "r"
    assert (shadow / "launcher" / "rl.sbatch").exists()
    r = subprocess.run(
        [sys.executable, "-m", "toolkit.cli", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=CLI_TIMEOUT_S,
        check=False,
        env=_failing_squeue(tmp_path / "bin"),
    )
    assert r.returncode != 0 and "squeue could not say" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert (shadow / "launcher" / "rl.sbatch").exists()


def _gate_files(run: RunDir) -> list[Path]:
    """What a first-run gate leaves in a run directory: its Slurm job's own run directory and its verdicts."""
    files = [
        run.gate_run("validate").log_attempt(1) / "gate.log",
        run.gate_run("validate").configs / "attempt_1" / "gate.json",
        run.reports / "eval_validate.json",
        run.reports / "eval_validate.md",
    ]
    for f in files:
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("gate\n")
    return files


def test_a_dry_run_directory_with_a_gate_is_taken_over_and_keeps_the_gate(tmp_path):
    # The careful order: a dry run, the gate (training chained behind it), then the run. The gate's files belong to
    # the config, not to a training attempt; anything else in reports/ still keeps the directory.
    out = tmp_path / "out"
    args = ("rl", "@", JOB, "--dry-run", "--output-dir", out, "--run.name", "r")
    assert srl(*args).returncode == 0
    run = RunDir(out / "r")
    gate = _gate_files(run)
    assert only_dry_runs(run)
    (run.reports / "summary.md").write_text("x")
    assert not only_dry_runs(run)
    (run.reports / "summary.md").unlink()
    again = srl(*args)
    assert again.returncode == 0, again.stderr
    assert all(f.read_text() == "gate\n" for f in gate)
    assert run.attempts() == [1]  # the dry run's attempt was replaced, not continued


def test_clean_keeps_the_gate_and_deletes_the_rest(tmp_path):
    from toolkit.launch.prepare import _delete_run_dir

    run = RunDir(tmp_path / "r")
    gate = _gate_files(run)
    for rel in ("metrics.jsonl", "reports/summary.md", "checkpoints/step_1/COMPLETE", "logs/attempt_1/trainer.log"):
        (run.root / rel).parent.mkdir(parents=True, exist_ok=True)
        (run.root / rel).write_text("x")
    _delete_run_dir(run.root)
    assert sorted(p.relative_to(run.root).as_posix() for p in run.root.rglob("*") if p.is_file()) == sorted(
        f.relative_to(run.root).as_posix() for f in gate
    )
