"""Gate verdicts: printing, live gate items from rollouts, Slurm job parameters, API key handling (the verdict
files themselves: test_run_verdict.py)."""

from __future__ import annotations

import pytest

from toolkit.config import load_config
from toolkit.evalgate import _gate_config, _gate_roles, _parser, print_verdict
from toolkit.evalgate.run import GateThresholds, _env_items, api_headers
from toolkit.placement.plan import build_plan
from toolkit.preflight.site import load_site
from toolkit.render import build_context
from toolkit.run.layout import RunDir
from toolkit.run.types import Rollout, TrainingSample
from toolkit.run.verdict import GateItem, Verdict


def test_plain_print_names_failed_items(capsys):
    v = Verdict("validate", [GateItem("known_failures", "e", "FAIL", "empty scored 1.0")])
    print_verdict(v, rich=False)
    out = capsys.readouterr().out
    assert "FAIL  e  known_failures: empty scored 1.0" in out and "GATE FAILED: e/known_failures" in out


def test_api_key_read_from_named_variable_only(monkeypatch):
    monkeypatch.setenv("SRL_TEST_KEY", "sekret")
    assert api_headers("SRL_TEST_KEY") == {"Authorization": "Bearer sekret"}
    assert api_headers(None) == {}
    monkeypatch.delenv("SRL_TEST_KEY")
    with pytest.raises(ValueError) as e:
        api_headers("SRL_TEST_KEY")
    assert "SRL_TEST_KEY" in str(e.value) and "sekret" not in str(e.value)


def _rollout(example: int, reward: float, *, turns: int = 1, truncated: bool = False, error: str | None = None):
    if error:
        return Rollout("env", f"t{example}", example, error_class=error, error_message="boom")
    mask = [True, True] + ([False, True] * (turns - 1))
    sample = TrainingSample([1, 2, 3], [5] * len(mask), mask, [-0.1] * len(mask))
    return Rollout(
        "env",
        f"t{example}",
        example,
        [sample],
        reward=reward,
        num_turns=turns,
        truncated=truncated,
        truncation_reason="max_tokens" if truncated else None,
        timings={"total": 0.5},
    )


def test_live_items_from_rollouts(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('[[orchestrator.train.env]]\nname = "env"\ntaskset = { id = "srl-reverse-text" }\n')
    env = load_config([path]).config.orchestrator.train.env[0].model_copy(update={"name": "env"})
    groups = [
        [_rollout(0, 0.2), _rollout(0, 0.7)],  # mixed
        [_rollout(1, 0.0), _rollout(1, 0.0, truncated=True)],  # solve-none
        [_rollout(2, 1.0), _rollout(2, 0.0, error="ProviderError")],  # one valid rollout: not counted
    ]
    info = {
        "kind": "train",
        "workers": 1,
        "workers_healthy": 1,
        "start_s": 0.1,
        "num_examples": 3,
        "worker_task_ids": ["t0", "t1", "t2"],
    }
    stored = {"rows": 6, "path": "x"}
    th = GateThresholds(max_error_rate=0.1, max_truncation_rate=0.5, min_mixed_share=0.5)
    items = {i.key: i for i in _env_items(env, groups, info, {"t0": "", "t1": "", "t2": ""}, stored, th)}
    assert items["env_server"].status == "PASS"
    assert items["traces_recorded"].status == "PASS"
    assert items["mixed_reward"].evidence["groups"] == 2 and items["mixed_reward"].evidence["mixed"] == 1
    assert items["mixed_reward"].status == "PASS"  # 1 of 2 groups >= 0.5
    assert items["error_rate"].status == "FAIL" and items["error_rate"].evidence["by_class"] == {"ProviderError": 1}
    assert items["truncation_rate"].evidence["truncated"] == 1 and items["truncation_rate"].status == "PASS"
    assert items["bounded_use"].status == "PASS"
    # A store that lost rows and a worker that loaded other tasks both fail.
    info2 = {**info, "worker_task_ids": ["x0", "x1", "x2"]}
    items = {i.key: i for i in _env_items(env, groups, info2, {"t0": "", "t1": "", "t2": ""}, {"rows": 5}, th)}
    assert items["env_server"].status == "FAIL" and items["traces_recorded"].status == "FAIL"


def _gate_job(tmp_path, command: str, *options: str) -> tuple[list[str], list]:
    """The #SBATCH lines and plan processes of ``srl eval <command>``'s job on the local Slurm site."""
    path = tmp_path / "run.toml"
    path.write_text(
        'site = "local-slurm"\n[[orchestrator.train.env]]\ntaskset = { id = "srl-reverse-text" }\n'
        '[slurm]\ntime = "00:10:30"\nrequeue = true\nextra_directives = ["--mail-type=END"]\n'
    )
    cfg = _gate_config(load_config([path])).config
    args, _ = _parser(command).parse_known_args(list(options))
    site, run = load_site("local-slurm"), RunDir(tmp_path / "r" / "eval" / command)
    plan = build_plan(cfg, site, run, job_id="$SLURM_JOB_ID", roles=_gate_roles(command, args), port_key="k")
    return build_context(cfg, site, run, plan, attempt=1, kind="eval").directives[0], plan.processes


def test_the_gate_job_follows_site_and_config(tmp_path):
    directives, procs = _gate_job(tmp_path, "run")
    assert "--partition=debug" in directives and "--time=00:10:30" in directives
    assert "--gres=gpu:1" in directives  # it serves its model: one of the local cluster's fake GPUs, gres-style
    assert not any(d.startswith("--account") for d in directives)  # no accounting on this site
    assert "--mail-type=END" in directives
    # A gate has nothing to checkpoint: never requeued, whatever the run's slurm.requeue says.
    assert "--no-requeue" in directives and not any(d.startswith("--signal") for d in directives)
    [gate] = procs
    assert (gate.name, gate.role, gate.gpus) == ("gate", "gate", (0,))
    assert gate.command == ["srl", "eval", "job", "--run-dir", str(tmp_path / "r" / "eval" / "run")]
    for command, options in (("validate", ()), ("run", ("--base-url", "http://h:1/v1"))):
        directives, procs = _gate_job(tmp_path, command, *options)
        assert not any("gpu" in d for d in directives), (command, directives)  # model-free or a remote model
        assert procs[0].gpus == ()


def test_the_gate_jobs_options_travel_in_gate_json(tmp_path, monkeypatch, capsys):
    """A Slurm gate's dry run writes its job's plan, batch script and options (nothing submitted); the job's process
    (``srl eval job``) runs exactly those options, on its own attempt's resolved config."""
    import json
    from pathlib import Path

    from toolkit.evalgate import main

    job = Path(__file__).resolve().parents[2] / "jobs" / "reverse-text" / "eval.toml"
    run_dir = tmp_path / "gated"
    argv = ["@", str(job), "--site", "local-slurm", "--run-dir", str(run_dir), "--dry-run"]
    assert main(["validate", *argv, "-n", "3", "--env", "reverse-text", "--success-min", "0.9", "--no-rich"]) == 0
    gate_run = RunDir(run_dir / "eval" / "validate")
    spec = json.loads(gate_run.gate_spec(1).read_text())
    assert spec == {
        "command": "validate",
        "options": {"env": ["reverse-text"], "num_examples": 3, "success_min": 0.9, "failure_max": 0.0},
        "run_dir": str(run_dir),
    }
    assert (gate_run.launcher / "eval.sbatch").is_file() and not gate_run.job_ids_file.exists()
    monkeypatch.setenv("SRL_ATTEMPT", "1")
    assert main(["job", "--run-dir", str(gate_run.root)]) == 0
    verdict = json.loads((run_dir / "reports" / "eval_validate.json").read_text())
    assert verdict["passed"] and verdict["settings"] == {
        "envs": ["reverse-text"],
        "n": 3,
        "success_min": 0.9,
        "failure_max": 0.0,
        "run_dir": str(run_dir),
        "gate_attempt": 1,  # which of the gate directory's jobs wrote it (srl status compares it with the newest)
    }
    # `srl eval run` against an endpoint: paths given relative to the login node's directory reach the job whole.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tok").mkdir()
    run_args = ["--base-url", "http://127.0.0.1:9/v1", "--tokenizer", "tok", "-r", "2"]
    assert main(["run", *argv, *run_args]) == 0
    options = json.loads(RunDir(run_dir / "eval" / "run").gate_spec(1).read_text())["options"]
    assert options["tokenizer"] == str(tmp_path / "tok") and options["rollouts_per_example"] == 2
    # --api-key-var: the job step gets the key by name (the config's secrets' way), never its value.
    monkeypatch.setenv("GATE_KEY", "sk-do-not-print")
    assert main(["run", *argv, *run_args, "--api-key-var", "GATE_KEY"]) == 0
    # (A dry run beside an existing gate directory writes under its .dry-run/.)
    script = (RunDir(run_dir / "eval" / ".dry-run" / "run").launcher / "eval.sbatch").read_text()
    assert "--secret GATE_KEY" in script and "sk-do-not-print" not in script
    assert not any("sk-do-not-print" in f.read_text() for f in run_dir.rglob("*") if f.is_file())
    # Not for a gate: --resume and --clean (each gate is a new attempt); --dry-run where the gate runs in-process.
    assert main(["validate", "@", str(job), "--run-dir", str(run_dir), "--resume"]) == 2
    assert main(["validate", "@", str(job), "--run-dir", str(run_dir), "--dry-run"]) == 2
    assert "--resume does not apply" in capsys.readouterr().err


def test_an_api_key_variable_is_checked_before_anything_is_written(tmp_path, monkeypatch, capsys):
    """An unset ``--api-key-var`` (a Slurm job would find no key either) and a value that is no variable name (often
    the key pasted itself, so never echoed) are refused up front."""
    from pathlib import Path

    from toolkit.evalgate import main

    job = Path(__file__).resolve().parents[2] / "jobs" / "reverse-text" / "eval.toml"
    run_dir = tmp_path / "gated"
    argv = ["run", "@", str(job), "--site", "local-slurm", "--run-dir", str(run_dir), "--dry-run"]
    monkeypatch.delenv("GATE_KEY", raising=False)
    assert main([*argv, "--base-url", "http://127.0.0.1:9/v1", "--api-key-var", "GATE_KEY"]) == 2
    assert "--api-key-var GATE_KEY: that environment variable is unset or empty" in capsys.readouterr().err
    assert main([*argv, "--base-url", "http://127.0.0.1:9/v1", "--api-key-var", "sk-abc.123"]) == 2
    err = capsys.readouterr().err
    assert "name of an exported environment variable" in err and "sk-abc.123" not in err
    # A token that happens to be a valid name (hf_..., unset as a variable) is refused without being shown.
    assert main([*argv, "--base-url", "http://127.0.0.1:9/v1", "--api-key-var", "hf_abcDEF123"]) == 2
    err = capsys.readouterr().err
    assert "--api-key-var: that environment variable is unset" in err and "hf_abcDEF123" not in err
    assert not run_dir.exists()
