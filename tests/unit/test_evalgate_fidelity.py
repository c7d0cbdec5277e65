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
        assert all(("checker crashed" in str(e["error"]) or "grader misconfigured" in str(e["error"]))
                   for e in failed.evidence["examples"])
    for env in ("exec-wrong-ref", "tagged-wrong-ref"):
        failed = items[(env, "known_successes")]
        assert failed.status == "FAIL" and "Task.validate(runtime) check(s) returned False" in failed.detail
        assert failed.evidence["examples"][0]["verifiers"] == "invalid"
    assert str(private_fixtures) not in sys.path  # the workers' path is only borrowed


def test_refused_environment_fails_taskset_loads_with_the_refusal(tmp_path):
    envs = '[[orchestrator.train.env]]\nname = "bo2"\ntaskset = { id = "best-of-two" }\n'
    verdict = validate_config(_config(tmp_path, FIXTURES, envs), n=2)
    item = next(i for i in verdict.items if i.key == "taskset_loads")
    assert item.status == "FAIL" and item.detail.startswith("srl eval validate replays replies through the plain chat")
    assert "env 'bo2': the taskset's module best_of_two exports its own Env class" in item.detail
    sys.modules.pop("best_of_two", None)


def test_multi_line_errors_stay_in_their_markdown_row():
    from toolkit.run.verdict import GateItem, Verdict

    v = Verdict(
        "validate", [GateItem("taskset_loads", "a|b", "FAIL", "first line\nsecond | line", {"e": "x`y"})]
    )
    rows = [line for line in v.to_markdown().splitlines() if line.startswith("| a")]
    assert rows == ['| a\\|b | taskset loads | **FAIL** | first line<br>second \\| line | ``{"e": "x`y"}`` |']
