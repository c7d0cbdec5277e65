"""Taskset id resolution: built-ins first, else an importable module exporting exactly one Taskset subclass."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from prereqs import need_module

need_module("verifiers.v1")

from toolkit.envs.episode import Episode
from toolkit.envs.registry import load_tasks, taskset_class
from toolkit.errors import TaskError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "external_taskset"


@pytest.fixture
def external_path(monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURES))
    yield
    for name in ("count_letters", "raising_scorer"):
        sys.modules.pop(name, None)


def ts(id_: str, **extra):
    return SimpleNamespace(id=id_, split="train", seed=0, select=None, model_extra=extra)


def test_builtin_ids_resolve():
    for id_, cls in (
        ("srl-reverse-text", "ReverseTextTaskset"),
        ("srl-arith", "ArithTaskset"),
        ("srl-alphabet-sort", "AlphabetSortTaskset"),
    ):
        assert taskset_class(id_).__name__ == cls


async def _score(task, reply: str) -> dict:
    """One episode of ``task`` answered with ``reply``, as an env worker plays it: its score dict."""
    episode = Episode(task)
    try:
        await episode.start()
        await episode.step(reply)
        await episode.finalize()
        return await episode.score()
    finally:
        await episode.close()


def test_unknown_id_fails_clearly():
    with pytest.raises(ModuleNotFoundError, match="no-such-taskset"):
        taskset_class("no-such-taskset")


def test_external_taskset_resolves_with_typed_fields(external_path):
    assert taskset_class("count-letters").__name__ == "CountLettersTaskset"
    tasks = load_tasks(ts("count-letters", letter="p", num_examples=5))
    assert len(tasks) == 5 and all("'p'" in t.data.prompt for t in tasks)
    task = tasks[0]

    assert asyncio.run(_score(task, str(task.data.answer)))["reward"] == 1.0
    assert asyncio.run(_score(task, str(task.data.answer + 1)))["reward"] == 0.0


def test_external_rejects_unknown_field(external_path):
    with pytest.raises(Exception, match="no_such_field"):
        load_tasks(ts("count-letters", no_such_field=1))


def test_raising_scorer_is_task_error(external_path):
    task = load_tasks(ts("raising-scorer"))[0]

    with pytest.raises(TaskError, match="scorer bug on purpose"):
        asyncio.run(_score(task, "anything"))
