"""``srl eval validate`` returns verifiers' own verdicts: on every corpus taskset, verifiers' validate (its
``run_validate``, the code behind ``vf-validate``) and srl's gate agree on the gold check (``Task.validate``; None is
unchecked, never a failure) and on the noop check (the untouched task must not pass); srl's extra checks never turn
an unchecked or valid task into a failed one."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from toolkit.config import load_config
from toolkit.evalgate.validate import validate_config

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
PATHS = [FIXTURES / "vf_envs", FIXTURES / "published_reverse_text", FIXTURES / "broken_taskset"]

# (taskset id, extra taskset fields): each published-style fixture and its broken twins.
CORPUS = [
    ("reverse-text", {}),
    ("tagged-answer", {}),
    ("tagged-answer", {"flaw": "wrong_reference"}),
    ("tagged-answer", {"flaw": "reward_raises"}),
    ("exec-check", {}),
    ("exec-check", {"flaw": "wrong_reference"}),
    ("empty-wins", {}),
]
N = 3


@pytest.fixture(autouse=True)
def _forget_fixture_modules():
    """The corpus modules imported here stay out of later tests' sys.modules (some assert a module was never
    imported into the test process)."""
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        module = sys.modules.get(name)
        if any(str(p) in str(getattr(module, "__file__", "") or "") for p in PATHS):
            del sys.modules[name]


def _verifiers_rows(taskset_id: str, fields: dict, out: Path) -> list[dict]:
    from verifiers.v1.cli.validate import run_validate
    from verifiers.v1.configs.cli.validate import ValidateConfig
    from verifiers.v1.runtimes import SubprocessConfig

    config = ValidateConfig(
        taskset={"id": taskset_id, **fields},
        runtime=SubprocessConfig(),
        rich=False,
        output_dir=out,
        select={"limit": N},
    )
    return asyncio.run(run_validate(config))


def _srl_items(taskset_id: str, fields: dict, tmp_path: Path) -> dict[str, object]:
    taskset = ", ".join([f'id = "{taskset_id}"', *(f'{k} = "{v}"' for k, v in fields.items())])
    path = tmp_path / "run.toml"
    path.write_text(
        f'env_vars = {{ PYTHONPATH = "{":".join(map(str, PATHS))}" }}\n'
        "[[orchestrator.train.env]]\n"
        f'name = "e"\ntaskset = {{ {taskset} }}\ntimeout = {{ rollout = 60, scoring = 10 }}\nmax_total_tokens = 512\n'
        "[inference.vllm]\nmax_model_len = 512\n"
    )
    verdict = validate_config(load_config([path]).config, n=N)
    return {i.key: i for i in verdict.items}


@pytest.mark.parametrize(("taskset_id", "fields"), CORPUS, ids=[f"{t}-{f.get('flaw', 'ok')}" for t, f in CORPUS])
def test_srl_and_verifiers_validate_agree(taskset_id, fields, tmp_path, monkeypatch):
    for p in PATHS:
        monkeypatch.syspath_prepend(str(p))
    rows = _verifiers_rows(taskset_id, fields, tmp_path / "vf")
    assert len(rows) == N
    items = _srl_items(taskset_id, fields, tmp_path)
    gold = {r["gold"]["reason"] for r in rows}
    noop = {r["noop"]["reason"] for r in rows}
    success, failure = items["known_successes"], items["known_failures"]
    # srl reports verifiers' own per-check counts.
    assert sum(success.evidence["verifiers"]["gold"].values()) == N
    assert success.evidence["verifiers"]["gold"] == {k: sum(r["gold"]["reason"] == k for r in rows) for k in gold}
    if gold & {"invalid", "error", "timeout"}:
        assert success.status == "FAIL", success.detail
    elif gold == {"valid"}:
        assert success.status == "PASS", success.detail
    else:  # unchecked by verifiers: srl may add confidence, never a failure
        assert success.status in ("PASS", "WARN"), success.detail
    if noop & {"invalid", "error", "timeout"}:
        assert failure.status == "FAIL" and "untouched" in failure.evidence["cases"], failure.detail
    else:
        assert "untouched" not in failure.evidence.get("cases", []), failure.detail


def test_published_reverse_text_is_unchecked_not_failed(tmp_path, monkeypatch):
    """The published reverse-text defines no Task.validate and wants its answer in tags: replaying data.answer
    scores 0, which leaves the tasks unchecked (a WARN naming the fix), and its known failures (all 0.0) pass."""
    monkeypatch.syspath_prepend(str(PATHS[1]))
    items = _srl_items("reverse-text", {}, tmp_path)
    assert items["known_successes"].status == "WARN"
    assert "Task.validate" in items["known_successes"].detail
    assert items["known_failures"].status == "PASS", items["known_failures"].detail
