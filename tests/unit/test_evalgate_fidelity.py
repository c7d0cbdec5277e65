"""``srl eval validate`` follows verifiers: the environment's own ``Task.validate(runtime)`` is the known-correct
check, tasks are named as verifiers names them (rows with only ``idx`` are fine), tasks import from the workers'
``env_vars.PYTHONPATH``, a broken twin fails naming what is wrong, and multi-line errors stay inside their row."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from toolkit.config import load_config
from toolkit.evalgate.validate import validate_config

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vf_envs"


@pytest.fixture
def private_fixtures(tmp_path, monkeypatch):
    """The fixture modules under names no other test imported, reachable only through env_vars.PYTHONPATH."""
    root = tmp_path / "envs"
    root.mkdir()
    for name in ("exec_check", "tagged_answer"):
        shutil.copy(FIXTURES / f"{name}.py", root / f"gate_{name}.py")
    yield root
    for name in ("gate_exec_check", "gate_tagged_answer"):
        sys.modules.pop(name, None)


def _config(tmp_path: Path, root: Path, envs: str):
    p = tmp_path / "run.toml"
    p.write_text(f'[env_vars]\nPYTHONPATH = "{root}"\n{envs}')
    return load_config([p]).config


ENVS = """
[[orchestrator.train.env]]
name = "exec"
taskset = { id = "gate-exec-check", num_examples = 4 }
[[orchestrator.train.env]]
name = "exec-raises"
taskset = { id = "gate-exec-check", num_examples = 4, flaw = "reward_raises" }
[[orchestrator.train.env]]
name = "exec-wrong-ref"
taskset = { id = "gate-exec-check", num_examples = 4, flaw = "wrong_reference" }
[[orchestrator.train.env]]
name = "tagged"
taskset = { id = "gate-tagged-answer" }
[[orchestrator.train.env]]
name = "tagged-raises"
taskset = { id = "gate-tagged-answer", flaw = "reward_raises" }
[[orchestrator.train.env]]
name = "tagged-wrong-ref"
taskset = { id = "gate-tagged-answer", flaw = "wrong_reference" }
[[orchestrator.eval.env]]
name = "exec-held-out"
taskset = { id = "gate-exec-check", dataset_split = "test", num_examples = 4 }
"""


def test_correct_fixtures_pass_and_broken_twins_fail_naming_the_fault(tmp_path, private_fixtures):
    assert str(private_fixtures) not in sys.path
    verdict = validate_config(_config(tmp_path, private_fixtures, ENVS), n=4)
    items = {(i.env, i.key): i for i in verdict.items}
    for env in ("exec", "tagged", "exec-held-out"):
        bad = [i for (e, _), i in items.items() if e == env and i.status == "FAIL"]
        assert not bad, bad
    assert "4 pass Task.validate(runtime)" in items[("exec", "known_successes")].detail
    assert items[("exec", "taskset_loads")].evidence["first_ids"] == ["idx:0", "idx:1", "idx:2"]
    assert items[("exec-held-out", "taskset_loads")].evidence["split"] == {"dataset_split": "test"}
    for env in ("exec-raises", "tagged-raises"):
        failed = items[(env, "known_failures")]
        assert failed.status == "FAIL" and "raised" in failed.detail
        # verifiers' noop check records the raise as it came; srl's scored replies carry it as a TaskError.
        assert "untouched" in failed.evidence["cases"] and set(failed.evidence["verifiers"]) == {"error"}
        assert all(
            ("checker crashed" in str(e["error"]) or "grader misconfigured" in str(e["error"]))
            for e in failed.evidence["examples"]
        )
    for env in ("exec-wrong-ref", "tagged-wrong-ref"):
        failed = items[(env, "known_successes")]
        assert failed.status == "FAIL" and "Task.validate(runtime) check(s) returned False" in failed.detail
        assert failed.evidence["examples"][0]["verifiers"] == "invalid"
    assert str(private_fixtures) not in sys.path  # the workers' path is only borrowed


def test_envs_on_verifiers_own_rollout_get_verifiers_checks_only(tmp_path):
    # best-of-two exports its own Env, codebook-lookup serves a tool: training runs both through verifiers' own
    # rollout, so no reply is replayed; verifiers' gold (None: unchecked) and noop checks decide, as verifiers'
    # own validate does, and nothing contradicts them.
    envs = (
        '[[orchestrator.train.env]]\nname = "bo2"\ntaskset = { id = "best-of-two" }\n'
        '[[orchestrator.train.env]]\nname = "codes"\ntaskset = { id = "codebook-lookup" }\n'
    )
    verdict = validate_config(_config(tmp_path, FIXTURES, envs), n=2)
    items = {(i.env, i.key): i for i in verdict.items}
    for env in ("bo2", "codes"):
        loads = items[(env, "taskset_loads")]
        assert loads.status == "PASS" and "runs through verifiers' own rollout" in loads.detail, loads
        assert loads.evidence["runs_through"] == "verifiers' own rollout" and loads.evidence["why_verifiers_rollout"]
        ok = items[(env, "known_successes")]
        assert ok.status == "WARN" and ok.evidence["verifiers"]["gold"] == {"unchecked": 2}, ok
        assert "define `Task.validate(runtime)`" in ok.detail and "reference_replies" not in ok.detail
        bad = items[(env, "known_failures")]
        assert bad.status == "PASS" and bad.evidence["verifiers"] == {"valid": 2}, bad
        assert "no reply replayed" in bad.detail and set(bad.evidence) == {"verifiers"}
        assert items[(env, "deterministic_scoring")].status == "PASS"
        assert items[(env, "deterministic_scoring")].evidence["replies_rescored"] == 0
    assert "env 'bo2': the taskset's module best_of_two exports its own Env class" in " ".join(
        items[("bo2", "taskset_loads")].evidence["why_verifiers_rollout"]
    )
    for mod in ("best_of_two", "codebook_lookup"):
        sys.modules.pop(mod, None)


def test_multi_line_errors_stay_in_their_markdown_row():
    from toolkit.run.verdict import GateItem, Verdict

    v = Verdict("validate", [GateItem("taskset_loads", "a|b", "FAIL", "first line\nsecond | line", {"e": "x`y"})])
    rows = [line for line in v.to_markdown().splitlines() if line.startswith("| a")]
    assert rows == ['| a\\|b | taskset loads | **FAIL** | first line<br>second \\| line | ``{"e": "x`y"}`` |']
