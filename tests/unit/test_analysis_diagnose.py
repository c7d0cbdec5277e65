"""srl diagnose names the seed's boundary for each way a run can fail (one test per failure kind)."""

from __future__ import annotations

from pathlib import Path

import pytest
from analysis_runs import make_run

from analysis.diagnose import diagnose, format_findings


def _boundaries(tmp_path: Path, failure: str | None) -> list[str]:
    return [f.boundary for f in diagnose(make_run(tmp_path / "run", failure=failure, steps=6))]


@pytest.mark.parametrize(
    ("failure", "boundary"),
    [
        ("provider", "ProviderError"),
        ("harness", "HarnessError"),
        ("toolset", "ToolsetError/UserError"),
        ("sandbox", "SandboxError/TunnelError"),
        ("task", "TaskError"),
    ],
)
def test_error_class_boundary(tmp_path: Path, failure: str, boundary: str) -> None:
    findings = diagnose(make_run(tmp_path / "run", failure=failure, steps=4))
    assert findings[0].boundary == boundary
    f = findings[0]
    assert f.evidence["count"] > 0 and f.evidence["first_step"] == 0
    assert f.evidence["log_file"] == "logs/attempt_1/orchestrator.log" and f.evidence["log_line"] >= 1
    assert boundary.split("/")[0] in f.evidence["excerpt"]
    assert "trainer instability" not in [x.boundary for x in findings]


def test_retry_advice_differs_for_transient_and_deterministic(tmp_path: Path) -> None:
    provider = diagnose(make_run(tmp_path / "p", failure="provider", steps=2))[0]
    task = diagnose(make_run(tmp_path / "t", failure="task", steps=2))[0]
    assert "Retries with backoff help" in provider.advice
    assert "retries do not fix it" in task.advice


def test_all_zero_rewards(tmp_path: Path) -> None:
    assert _boundaries(tmp_path, "all_zero")[:2] == ["all-zero groups", "valid low reward"]


def test_valid_low_reward(tmp_path: Path) -> None:
    assert _boundaries(tmp_path, "low_reward") == ["valid low reward"]


def test_diverging_trainer(tmp_path: Path) -> None:
    (finding,) = diagnose(make_run(tmp_path / "run", failure="trainer", steps=8))
    assert finding.boundary == "trainer instability"
    assert "mismatch_kl grew" in finding.summary and "grad-norm spike" in finding.summary
    assert "NaN" in finding.summary
    assert finding.evidence["grad_norm_spikes"] == 1


@pytest.mark.parametrize(
    ("failure", "boundary"),
    [
        ("timeout", "Slurm: time limit"),
        ("oom", "Slurm: out of memory"),
        ("node_fail", "Slurm: node failure"),
        ("preempt", "Slurm: preemption"),
        ("cancelled", "Slurm: cancelled"),
    ],
)
def test_slurm_causes(tmp_path: Path, failure: str, boundary: str) -> None:
    findings = diagnose(make_run(tmp_path / "run", failure=failure, steps=3))
    assert [f.boundary for f in findings] == [boundary]
    assert findings[0].evidence["log_file"] == "logs/attempt_1/slurm-4242.out"
    assert findings[0].evidence["log_line"] == 2


def test_healthy_run_has_no_findings(tmp_path: Path) -> None:
    assert _boundaries(tmp_path, None) == []
    assert format_findings([]).startswith("No failures found")


def test_format_is_plain_text(tmp_path: Path) -> None:
    text = format_findings(diagnose(make_run(tmp_path / "run", failure="task", steps=2)))
    assert text.startswith("1. [ERROR] TaskError:")
    assert "first_message: scoring raised ZeroDivisionError" in text
    assert "advice:" in text and "[/" not in text and "\x1b[" not in text


def test_missing_run_dir(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        diagnose(tmp_path / "nope")


def test_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from analysis.diagnose import main

    assert main([str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main([str(make_run(tmp_path / "ok", steps=2).root)]) == 0
    assert main([str(make_run(tmp_path / "bad", failure="harness", steps=2).root)]) == 1
    assert "HarnessError" in capsys.readouterr().out
