"""Taskset ids resolve as verifiers resolves them: an installed environment whose id is also an srl built-in's wins;
the resolved source is printed with the dry run's notes, kept in the resolved config and reported by the worker."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from toolkit.envs.tasksets import resolve_taskset_source

SHADOW = """
from collections.abc import Iterator
import verifiers.v1 as vf

class ShadowData(vf.TaskData):
    answer: str

class ShadowTask(vf.Task[ShadowData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def exact(self, task: ShadowData, trace: vf.Trace) -> float:
        return float(trace.last_reply == task.answer)

class ShadowTaskset(vf.Taskset[ShadowTask, vf.TasksetConfig]):
    def load(self) -> Iterator[ShadowTask]:
        yield ShadowTask(ShadowData(id="shadow-0", prompt="Reverse abc", answer="cba"), self.config.task)

__all__ = ["ShadowTaskset"]
"""


@pytest.fixture
def installed_reverse_text(tmp_path, monkeypatch):
    """A package ``srl_reverse_text`` (the module verifiers imports for id ``srl-reverse-text``) on sys.path."""
    pkg = tmp_path / "srl_reverse_text"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(SHADOW)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # the job's import path, which preflight checks with
    yield tmp_path
    sys.modules.pop("srl_reverse_text", None)


def test_published_reverse_text_on_the_path_does_not_shadow_the_builtin(tmp_path, monkeypatch):
    """verifiers' published ``reverse-text`` environment (module ``reverse_text``) installed next to srl leaves
    srl's built-in ids alone: they are ``srl-``-prefixed, so no published id collides with them."""
    from toolkit.envs.tasksets import BUILTIN_TASKSETS

    (tmp_path / "reverse_text.py").write_text(SHADOW)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert resolve_taskset_source("srl-reverse-text").kind == "builtin"
        assert resolve_taskset_source("reverse-text").module == "reverse_text"
    finally:
        sys.modules.pop("reverse_text", None)
    assert all(i.startswith("srl-") for i in BUILTIN_TASKSETS)


def test_builtin_serves_an_id_nothing_else_provides():
    source = resolve_taskset_source("srl-reverse-text")
    assert (source.kind, source.module) == ("builtin", "toolkit.envs.tasksets.reverse_text")
    assert source.describe() == "srl's built-in toolkit.envs.tasksets.reverse_text"
    assert resolve_taskset_source("no-such-taskset-xyz") is None


def test_namespace_directory_does_not_shadow_a_builtin(tmp_path):
    (tmp_path / "arith").mkdir()  # a directory without __init__.py exports nothing
    assert resolve_taskset_source("srl-arith", [str(tmp_path)]).kind == "builtin"


def test_installed_environment_wins_over_the_builtin(installed_reverse_text):
    from toolkit.envs.registry import load_tasks, taskset_class

    source = resolve_taskset_source("srl-reverse-text")
    assert (source.kind, source.module) == ("module", "srl_reverse_text")
    assert source.origin == str(installed_reverse_text / "srl_reverse_text" / "__init__.py")
    assert taskset_class("srl-reverse-text").__name__ == "ShadowTaskset"
    ns = SimpleNamespace(id="srl-reverse-text", split="train", seed=0, select=None, model_extra={})
    assert [t.data.id for t in load_tasks(ns)] == ["shadow-0"]


def test_resolved_source_is_noted_and_kept_in_the_resolved_config(tmp_path, installed_reverse_text):
    from toolkit.config import load_config
    from toolkit.preflight import preflight

    p = tmp_path / "run.toml"
    p.write_text('[[orchestrator.train.env]]\ntaskset = { id = "srl-reverse-text" }\n')
    checked = preflight(load_config([p]))
    note = next(n for n in checked.notices if n.startswith("train env 'srl-reverse-text'"))
    assert "resolves to module srl_reverse_text at" in note and "srl's built-in of that id is not used" in note
    assert note in checked.config.notices  # written to configs/attempt_<n>/resolved/rl.json


def test_worker_reports_where_it_found_the_taskset(installed_reverse_text):
    from toolkit.envs.server import EnvWorker

    spec = {
        "name": "rt",
        "taskset": {"id": "srl-reverse-text", "split": None, "seed": 0, "select": None, "extra": {}},
        "harness": {"id": "default"},
        "max_turns": 1,
        "timeout": {},
    }
    info = __import__("asyncio").run(EnvWorker(spec).handle("info", {}))
    assert info["source"].startswith("module srl_reverse_text at ") and info["task_ids"] == ["shadow-0"]
