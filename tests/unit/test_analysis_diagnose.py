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
        ("reward_skipped", "RewardSkippedError"),
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


# Log lines as the local Slurm cluster wrote them (srl's batch log, slurmstepd in a step's log).
_TEARDOWN = "2026-12-01 11:25:59 srl[25]: teardown: trainer exited first (status 0)\n"
_STEP_CANCELLED = "slurmstepd-node1: error: *** STEP {job}.0 ON node1 CANCELLED AT 2026-12-01T{time} ***\n"


def _slurm_logs(tmp_path: Path, batch_log: str, step_log: str) -> list[str]:
    run = make_run(tmp_path / "run", steps=3)
    (run.logs / "run-25.out").write_text(batch_log)
    (run.logs / "attempt_1" / "inference-0-0.log").write_text("INFO engine serving\n" + step_log)
    return [f.boundary for f in diagnose(run)]


def test_steps_stopped_by_srls_own_teardown_are_not_a_cancel(tmp_path: Path) -> None:
    """A run that finished: srl's batch script stops the inference step after the trainer's last step, and
    slurmstepd writes CANCELLED into that step's log. Not a user's scancel (seen on the local cluster)."""
    assert _slurm_logs(tmp_path, _TEARDOWN, _STEP_CANCELLED.format(job=25, time="11:26:00")) == []
    # Same second as the teardown line: still srl's own stop.
    assert _slurm_logs(tmp_path / "b", _TEARDOWN, _STEP_CANCELLED.format(job=25, time="11:25:59")) == []


def test_steps_stopped_for_a_requeue_are_not_a_cancel(tmp_path: Path) -> None:
    batch = (
        "2026-12-01 11:25:59 srl[25]: received SIGUSR2: asking the trainer to checkpoint\n"
        "slurmstepd-node1: error: *** JOB 25 ON node1 CANCELLED AT 2026-12-01T11:26:10 DUE TO JOB REQUEUE ***\n"
    )
    assert _slurm_logs(tmp_path, batch, _STEP_CANCELLED.format(job=25, time="11:26:10")) == []


def test_user_scancel_of_the_job_is_a_cancel(tmp_path: Path) -> None:
    batch = (
        "slurmstepd-node1: error: *** JOB 25 ON node1 CANCELLED AT 2026-12-01T11:25:58 ***\n"
        "2026-12-01 11:25:58 srl[25]: received SIGTERM: stopping\n"
    )
    assert _slurm_logs(tmp_path, batch, _STEP_CANCELLED.format(job=25, time="11:25:58")) == ["Slurm: cancelled"]
    # Without the JOB line (only the steps' lines made it to the logs) the steps' cancel still counts.
    assert _slurm_logs(
        tmp_path / "b", batch.splitlines(keepends=True)[1], _STEP_CANCELLED.format(job=25, time="11:25:58")
    ) == ["Slurm: cancelled"]


def test_step_cancelled_before_srl_stopped_anything_is_a_cancel(tmp_path: Path) -> None:
    """`scancel 25.0` by someone: the step is cancelled first, then srl tears the job down because it ended."""
    batch = "2026-12-01 11:26:05 srl[25]: teardown: inference-0-0 exited first (status 143)\n"
    assert sorted(_slurm_logs(tmp_path, batch, _STEP_CANCELLED.format(job=25, time="11:26:04"))) == [
        "Slurm: cancelled",
        "Slurm: component failed",
    ]


def test_a_component_that_failed_first_is_named(tmp_path: Path) -> None:
    batch = "2026-12-01 11:26:05 srl[25]: teardown: orchestrator exited first (status 1)\n"
    run = make_run(tmp_path / "run", steps=3)
    (run.logs / "run-25.out").write_text(batch)
    (finding,) = diagnose(run)
    assert finding.boundary == "Slurm: component failed" and finding.severity == "error"
    assert "orchestrator exited first (status 1)" in finding.evidence["excerpt"]
    assert finding.evidence["log_file"] == "logs/run-25.out"
    assert _slurm_logs(tmp_path / "ok", _TEARDOWN, "") == []  # status 0: the run finished


def test_another_jobs_teardown_does_not_excuse_a_cancel(tmp_path: Path) -> None:
    assert _slurm_logs(tmp_path, _TEARDOWN, _STEP_CANCELLED.format(job=26, time="11:27:00")) == ["Slurm: cancelled"]


def test_skipped_reward_is_its_own_finding_not_a_low_reward(tmp_path: Path) -> None:
    (finding, *rest) = diagnose(make_run(tmp_path / "run", failure="reward_skipped", steps=4))
    assert finding.boundary == "RewardSkippedError" and finding.severity == "error"
    assert "silent 0" in finding.advice
    assert finding.evidence["classes"] == {"RewardSkippedError": finding.evidence["count"]}
    assert "TaskError" not in [f.boundary for f in rest]


def _slow_env_run(tmp_path: Path, *, max_async_level: int):
    """A run whose ``slow`` env's groups all finish 3 policy versions old (its episodes outlast 3 trainer steps)
    beside a ``fast`` env whose groups are 1 version old; the resolved config sets ``max_async_level``."""
    from toolkit.fsutil import atomic_write_json
    from toolkit.run.layout import RunDir, point_symlink
    from toolkit.run.store import RolloutStoreWriter
    from toolkit.run.types import Rollout

    run = RunDir(tmp_path / "run")
    run.config_attempt(1).joinpath("resolved").mkdir(parents=True)
    point_symlink(run.latest_configs, "attempt_1")
    atomic_write_json(run.resolved("rl"), {"orchestrator": {"max_async_level": max_async_level}})
    with RolloutStoreWriter(run.rollout_store) as w:
        for step in range(4, 10):
            rows = [
                Rollout(
                    env=env,
                    task_id="t",
                    example_id=0,
                    samples=[],
                    reward=0.5 * (i % 2),
                    group_id=10 * step + g,
                    policy_version=step - age,
                )
                for g, (env, age) in enumerate((("fast", 1), ("slow", 3)))
                for i in range(4)
            ]
            w.append(rows, step=step)
    return run


def test_an_env_whose_groups_outlast_the_off_policy_bound_is_named(tmp_path: Path) -> None:
    starved = [f for f in diagnose(_slow_env_run(tmp_path / "a", max_async_level=1)) if "starved" in f.boundary]
    assert [f.evidence["env"] for f in starved] == ["slow"]
    assert starved[0].evidence == {"env": "slow", "groups": 6, "dropped_groups": 6, "bound": 1}
    assert "max_async_level" in starved[0].advice
    # With the bound raised to cover the slow env's age, nothing is dropped and nothing is reported.
    assert not [f for f in diagnose(_slow_env_run(tmp_path / "b", max_async_level=3)) if "starved" in f.boundary]


@pytest.mark.parametrize("where", ["local", "slurm"])
def test_a_run_srl_stopped_on_a_criterion_is_no_failure(tmp_path: Path, where: str) -> None:
    from toolkit.run import ending
    from toolkit.run.launcher import write_local_record

    run = make_run(tmp_path / "run", steps=3)
    guard = "zero-signal guard: 10 consecutive steps without any group with differing rewards"
    end = ending.record_criterion(run, ending.ZERO_SIGNAL_GUARD, guard, role="orchestrator")
    if where == "local":
        run.launcher.mkdir(parents=True, exist_ok=True)
        write_local_record(run, attempt=1, status=end.exit_status)
    else:
        (run.logs / "run-25.out").write_text(
            "2026-12-01 11:26:05 srl[25]: teardown: orchestrator exited first (status 4)\n"
        )
    found = diagnose(run)
    assert [f.severity for f in found] == ["warning"], found
    assert found[0].boundary == "stopped by a stop criterion" and found[0].evidence["status"] == 4
    assert "zero-signal guard" in found[0].summary
    # The same status without srl's own ending is a failure.
    ending.clear(run)
    assert [f.severity for f in diagnose(run)] == ["error"]


def _distill_run(tmp_path: Path, tokens: list[float], kls: list[float], rewards: list[float], algo: str = "opsd"):
    """A run of one train env ``rt`` training by ``algo`` with group_size 1 (every group one rollout, rewards 0 or
    the step's mean): orchestrator metrics per step with the scored tokens (64 rollouts), the KL and the reward."""
    from toolkit.fsutil import append_jsonl, atomic_write_json
    from toolkit.run.layout import RunDir, point_symlink
    from toolkit.run.store import RolloutStoreWriter
    from toolkit.run.types import Rollout

    run = RunDir(tmp_path / "run")
    run.config_attempt(1).joinpath("resolved").mkdir(parents=True)
    point_symlink(run.latest_configs, "attempt_1")
    cfg = {"orchestrator": {"max_async_level": 1, "train": {"algo": {"type": algo}, "env": [{"name": "rt"}]}}}
    atomic_write_json(run.resolved("rl"), cfg)
    with RolloutStoreWriter(run.rollout_store) as w:
        for step, (tok, kl, r) in enumerate(zip(tokens, kls, rewards), 1):
            append_jsonl(
                run.metrics,
                {
                    "step": step,
                    "time": 1000.0 + step,
                    "role": "orchestrator",
                    "teacher/rt/kl": kl,
                    "teacher/rt/tokens": tok * 64,
                    "batch/rt/rollouts": 64,
                    "reward/rt/mean": r,
                },
            )
            rows = [
                Rollout(
                    env="rt",
                    task_id="t",
                    example_id=i,
                    samples=[],
                    reward=0.0,
                    group_id=100 * step + i,
                    policy_version=step - 1,
                )
                for i in range(8)
            ]
            w.append(rows, step=step)
    return run


def test_distillation_that_collapses_onto_the_empty_reply_is_named(tmp_path: Path) -> None:
    run = _distill_run(
        tmp_path / "a",
        [5.9, 6.0, 5.8, 3.0, 1.4, 1.3, 1.2],
        [0.2] * 3 + [0.05, 0.001, 0.0, 0.0],
        [0.2, 0.19, 0.18, 0.1, 0.02, 0.01, 0.01],
    )
    found = diagnose(run)
    assert found[0].boundary == "distillation collapsed to short replies" and found[0].severity == "error"
    assert found[0].evidence == {
        "env": "rt",
        "tokens_per_reply": [5.9, 1.3],
        "kl": [0.2, 0.0003],
        "reward": [0.19, 0.0133],
    }
    assert "opsd" in found[0].advice
    # every rollout scored 0 with group_size 1: no "all-zero groups" (a distilling env needs no reward spread)
    assert not [f for f in found if "groups" in f.boundary]
    # a distillation that learns (replies keep their length, the KL falls, reward rises) is not a collapse
    healthy = _distill_run(
        tmp_path / "b",
        [6.0] * 7,
        [5.7, 5.6, 5.5, 5.3, 5.0, 4.9, 4.8],
        [0.2, 0.22, 0.25, 0.28, 0.3, 0.33, 0.35],
        algo="opd",
    )
    assert not [f for f in diagnose(healthy) if "distillation" in f.boundary]
