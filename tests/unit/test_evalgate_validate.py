"""``srl eval validate`` (model-free first-run gate) on the built-in tasksets and on deliberately broken verifiers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from toolkit.config import load_config
from toolkit.evalgate import main
from toolkit.evalgate.validate import MALFORMED_REPLY, reference_replies, validate_config

REPO = Path(__file__).resolve().parents[2]
BROKEN = REPO / "tests" / "fixtures" / "broken_taskset"


def _cfg(text: str, tmp_path: Path):
    path = tmp_path / "run.toml"
    path.write_text(text)
    return load_config([path]).config


def _status(verdict) -> dict[tuple[str, str], str]:
    return {(i.env, i.key): i.status for i in verdict.items}


BUILTINS = """
[[orchestrator.train.env]]
name = "reverse-text"
taskset = { id = "srl-reverse-text", num_train_examples = 8, num_test_examples = 4 }
timeout = { rollout = 60, scoring = 10 }
max_total_tokens = 512

[[orchestrator.train.env]]
name = "alphabet-sort"
taskset = { id = "srl-alphabet-sort", num_train_examples = 8, num_test_examples = 4 }
max_turns = 3
max_total_tokens = 512

[[orchestrator.train.env]]
name = "arith"
taskset = { id = "srl-arith", num_train_examples = 8, num_test_examples = 4 }
max_total_tokens = 512

[inference.vllm]
max_model_len = 512
"""


def test_builtin_tasksets_pass_every_item(tmp_path):
    verdict = validate_config(_cfg(BUILTINS, tmp_path), n=5)
    status = _status(verdict)
    keys = ("taskset_loads", "known_successes", "known_failures", "deterministic_scoring", "bounded_limits")
    assert set(status) == {(e, k) for e in ("reverse-text", "alphabet-sort", "arith") for k in keys}
    assert all(s == "PASS" for s in status.values()), [i for i in verdict.items if i.status != "PASS"]
    assert verdict.passed


def test_multi_turn_reference_needs_enough_turns(tmp_path):
    # alphabet-sort has 2 turns by default: max_turns = 1 truncates the reference solution.
    cfg = _cfg(BUILTINS.replace("max_turns = 3", "max_turns = 1"), tmp_path)
    verdict = validate_config(cfg, envs=["alphabet-sort"], n=3)
    status = _status(verdict)
    assert status[("alphabet-sort", "known_successes")] == "FAIL"
    assert status[("alphabet-sort", "bounded_limits")] == "FAIL"
    item = next(i for i in verdict.items if i.key == "bounded_limits")
    assert "max_turns 1 < the 2 turns" in item.detail


@pytest.fixture()
def broken_cfg(monkeypatch):
    monkeypatch.syspath_prepend(str(BROKEN))
    # The job's (and so preflight's) import path: the environment's PYTHONPATH, not this process's sys.path.
    monkeypatch.setenv("PYTHONPATH", str(BROKEN))
    return load_config([BROKEN / "rl.toml"]).config


def test_empty_reply_scored_as_success_fails_known_failures(broken_cfg):
    verdict = validate_config(broken_cfg, envs=["empty-wins"], n=6)
    status = _status(verdict)
    assert status[("empty-wins", "known_failures")] == "FAIL"
    assert status[("empty-wins", "known_successes")] == "PASS"
    assert status[("empty-wins", "deterministic_scoring")] == "PASS"
    item = next(i for i in verdict.items if i.key == "known_failures")
    # verifiers' noop check (the untouched task already passes) and srl's empty reply both catch it.
    assert item.evidence["cases"] == ["empty", "untouched"]
    assert item.evidence["verifiers"] == {"invalid": 6}
    assert not verdict.passed


def test_nondeterministic_scorer_fails_determinism_only(broken_cfg):
    verdict = validate_config(broken_cfg, envs=["coin-flip"], n=6)
    failed = [(i.env, i.key) for i in verdict.failed()]
    assert failed == [("coin-flip", "deterministic_scoring")]


def test_cli_exit_status_and_report_files(broken_cfg, tmp_path, capsys):
    rc = main(["validate", "@", str(BROKEN / "rl.toml"), "-n", "4", "--no-rich", "--run-dir", str(tmp_path / "r")])
    assert rc == 1
    out = capsys.readouterr().out
    assert "FAIL  empty-wins  known_failures" in out and "GATE FAILED" in out
    data = json.loads((tmp_path / "r" / "reports" / "eval_validate.json").read_text())
    assert data["passed"] is False and data["command"] == "validate"
    assert (tmp_path / "r" / "reports" / "eval_validate.md").read_text().startswith("# First-run gate")
    rc = main(
        [
            "validate",
            "@",
            str(BROKEN / "rl.toml"),
            "-n",
            "4",
            "--no-rich",
            "--env",
            "nope",
            "--run-dir",
            str(tmp_path / "r"),
        ]
    )
    assert rc == 2


def test_reference_replies_shapes(tmp_path):
    from toolkit.envs.registry import load_tasks

    cfg = _cfg(BUILTINS, tmp_path)
    envs = {e.env_name: e for e in cfg.orchestrator.train.env}
    rt = load_tasks(envs["reverse-text"].taskset)[0]
    assert reference_replies(rt) == [rt.data.text[::-1]]
    al = load_tasks(envs["alphabet-sort"].taskset)[0]
    refs = reference_replies(al)
    assert len(refs) == len(al.data.turns) and refs[0].splitlines() == sorted(al.data.turns[0])
    assert MALFORMED_REPLY.strip() and MALFORMED_REPLY not in refs


@pytest.mark.parametrize(
    "command, extra",
    [("validate", ["-n", "0"]), ("validate", ["-n", "1000001"]), ("run", ["-r", "4097"]), ("run", ["-r", "0"])],
)
def test_example_and_rollout_counts_outside_their_bounds_are_usage_errors(command, extra, tmp_path, capsys):
    """-r 10**20 was accepted and would have sampled that many completions of each example."""
    run_dir = tmp_path / "r"
    rc = main([command, "@", str(REPO / "jobs/reverse-text/rl.toml"), *extra, "--run-dir", str(run_dir)])
    assert rc == 2 and not run_dir.exists()
    assert "-n must be 1 to 1000000 and -r 1 to 4096" in capsys.readouterr().err
