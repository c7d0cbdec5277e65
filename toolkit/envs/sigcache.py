"""A memo in front of ``inspect.signature`` for env worker processes.

Why: verifiers 0.4.0 looks up the signature of every reward and metric function twice per rollout it scores
(``Task.score`` asks whether each one needs a runtime, then ``invoke`` matches its parameters), and
``inspect.signature`` rebuilds the ``Signature`` object each time. In an env worker that was 28% of the CPU of an
episode (py-spy on ``tests/benchmarks/orchestrator_overhead.py``'s worker; reverse-text's LCS reward itself took
2%). The functions are the tasks' methods: defined once, called thousands of times.

What is memoised: plain Python functions and methods bound to them, called with ``inspect.signature``'s default
options. A hit is used only while the function still has the same code, defaults, keyword defaults and
annotations objects, and no ``__signature__`` or ``__wrapped__`` attribute (those are read by ``inspect`` and could
change what it returns); anything else (classes, partials, builtins, callable objects) goes straight to
``inspect.signature``. ``Signature`` objects are immutable, so sharing one is safe. Entries are weakly keyed by the
function, so a task module that is reloaded does not keep its old functions alive.

:func:`install` replaces ``inspect.signature`` in the calling process; only the env worker (``toolkit.envs.server``)
calls it, after loading its tasks.
"""

from __future__ import annotations

import inspect
import types
import weakref
from typing import Any

_original = inspect.signature
# function -> {bound?: (signature, code, defaults, kwdefaults, annotations)}
_memo: weakref.WeakKeyDictionary[types.FunctionType, dict[bool, tuple[Any, ...]]] = weakref.WeakKeyDictionary()


def _target(obj: Any) -> tuple[types.FunctionType, bool] | None:
    """(function, whether ``obj`` is a method bound to it), or None when ``obj`` is not memoised."""
    bound = isinstance(obj, types.MethodType)
    fn = obj.__func__ if bound else obj
    if type(fn) is not types.FunctionType:
        return None
    if "__signature__" in fn.__dict__ or "__wrapped__" in fn.__dict__:
        return None
    return fn, bound


def _state(fn: types.FunctionType) -> tuple[Any, ...]:
    return fn.__code__, fn.__defaults__, fn.__kwdefaults__, fn.__annotations__


def signature(
    obj: Any, *, follow_wrapped: bool = True, globals: Any = None, locals: Any = None, eval_str: bool = False
) -> inspect.Signature:
    """``inspect.signature(obj, ...)``, memoised for plain functions and bound methods (module docstring).
    Raises what ``inspect.signature`` raises (TypeError, ValueError)."""
    plain = follow_wrapped and globals is None and locals is None and not eval_str
    target = _target(obj) if plain else None
    if target is None:
        return _original(obj, follow_wrapped=follow_wrapped, globals=globals, locals=locals, eval_str=eval_str)
    fn, bound = target
    entry = _memo.get(fn, {}).get(bound)
    state = _state(fn)
    if entry is not None and all(a is b for a, b in zip(entry[1:], state)):
        return entry[0]
    sig = _original(obj)
    _memo.setdefault(fn, {})[bound] = (sig, *state)
    return sig


def install() -> None:
    """Make ``inspect.signature`` the memoised :func:`signature` in this process (idempotent)."""
    inspect.signature = signature  # type: ignore[assignment]
