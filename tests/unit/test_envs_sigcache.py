"""The env worker's memoised ``inspect.signature`` returns what ``inspect`` returns, and never a stale answer."""

from __future__ import annotations

import functools
import inspect

import pytest

from toolkit.envs import sigcache


class Task:
    def reward(self, task, trace, runtime=None) -> float:
        return 1.0

    @functools.wraps(reward)
    def wrapped(self, *args, **kwargs):
        return self.reward(*args, **kwargs)

    def __call__(self, x: int) -> int:
        return x


def plain(a, b=2, *, c=3):
    return a + b + c


CALLABLES = [
    plain,
    Task().reward,
    Task.reward,
    Task().wrapped,
    Task(),
    Task,
    functools.partial(plain, 1),
    len,
    lambda trace: trace,
]


@pytest.mark.parametrize("obj", CALLABLES, ids=lambda o: getattr(o, "__name__", type(o).__name__))
def test_same_answer_as_inspect(obj):
    assert sigcache.signature(obj) == sigcache._original(obj)
    assert sigcache.signature(obj) == sigcache._original(obj)  # the memoised answer too


def test_bound_methods_of_different_instances_share_one_entry():
    first = sigcache.signature(Task().reward)
    assert sigcache.signature(Task().reward) is first
    assert list(first.parameters) == ["task", "trace", "runtime"]
    assert list(sigcache.signature(Task.reward).parameters) == ["self", "task", "trace", "runtime"]


def test_a_changed_function_is_looked_up_again():
    def fn(a, b=1):
        return a

    before = sigcache.signature(fn)
    fn.__defaults__ = (5,)
    assert sigcache.signature(fn).parameters["b"].default == 5 and before.parameters["b"].default == 1
    fn.__signature__ = inspect.Signature([inspect.Parameter("z", inspect.Parameter.POSITIONAL_OR_KEYWORD)])
    assert list(sigcache.signature(fn).parameters) == ["z"]
    del fn.__signature__
    fn.__code__ = (lambda x, y, b=5: x).__code__
    assert list(sigcache.signature(fn).parameters) == ["x", "y", "b"]


def test_non_default_options_are_not_memoised():
    def fn(a: int):  # a string annotation here (``from __future__ import annotations``)
        return a

    assert sigcache.signature(fn, eval_str=True).parameters["a"].annotation is int
    assert sigcache.signature(fn).parameters["a"].annotation == "int"


def test_install_replaces_inspect_signature(monkeypatch):
    monkeypatch.setattr(inspect, "signature", sigcache._original)
    sigcache.install()
    assert inspect.signature is sigcache.signature
