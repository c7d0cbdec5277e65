"""One episode of the plain chat harness (``harness.id = "default"``, verifiers' ``null``), driven turn by turn.

srl samples the policy itself (token-in/token-out, see ``toolkit.orchestrator.rollout``); this module holds the
environment half of an episode inside an env worker: the task's ``setup``/``finalize`` hooks, the messages the
policy sees, the next user turn after each reply, stop checks and scoring with the task's ``@vf.reward`` and
``@vf.metric`` functions on a ``vf.Trace`` built from the conversation.

Multi-turn: after each assistant reply the harness calls the task's ``user_turn(trace) -> str | None`` if it
defines one (srl's hook; None ends the episode) and ends the episode when a ``@vf.stop`` predicate over
``(task, trace)`` returns true. A task without ``user_turn`` is single-turn.

Failures of task code raise ``toolkit.errors.TaskError``; a task's own verifiers error keeps its class.
"""

from __future__ import annotations

import inspect
import types
import weakref
from typing import Any

import verifiers.v1 as vf

from toolkit import errors as srl_errors

_VF_ERROR_CLASSES = {
    "ProviderError",
    "HarnessError",
    "ToolsetError",
    "UserError",
    "SandboxError",
    "TunnelError",
    "TaskError",
}


def as_srl_error(exc: BaseException, default: type[srl_errors.SrlRolloutError], context: str):
    """``exc`` as an srl rollout error: srl errors pass through, verifiers' typed errors keep their class name
    (verifiers.v1.errors uses the same taxonomy), anything else becomes ``default``."""
    if isinstance(exc, srl_errors.SrlRolloutError):
        return exc
    for klass in type(exc).__mro__:
        if klass.__name__ in _VF_ERROR_CLASSES:
            return getattr(srl_errors, klass.__name__)(f"{context}: {exc}")
    return default(f"{context}: {type(exc).__name__}: {exc}")


def _message(role: str, content: str) -> vf.Message:
    return {"system": vf.SystemMessage, "user": vf.UserMessage, "assistant": vf.AssistantMessage}[role](
        content=content
    )


def initial_messages(data: vf.TaskData) -> list[dict[str, str]]:
    """The chat the policy sees first: the task's system prompt, then its prompt (a string or messages)."""
    out: list[dict[str, str]] = []
    if data.system_prompt:
        out.append({"role": "system", "content": data.system_prompt})
    if isinstance(data.prompt, str):
        out.append({"role": "user", "content": data.prompt})
    elif data.prompt:
        for m in data.prompt:
            out.append({"role": m.role, "content": vf.types.content_text(m.content) or ""})
    return out


def _needs_only(fn: Any, available: dict[str, Any]) -> bool:
    """Whether every required parameter of ``fn`` can be filled from ``available`` by name."""
    for name, p in inspect.signature(fn).parameters.items():
        if (
            p.default is inspect.Parameter.empty
            and name not in available
            and p.kind
            not in (
                p.VAR_POSITIONAL,
                p.VAR_KEYWORD,
            )
        ):
            return False
    return True


def _per_task(cache: weakref.WeakKeyDictionary, task: Any, compute: Any) -> Any:
    """``compute(task)``, kept in the weakly keyed ``cache`` (a task type that cannot be weakly referenced is computed
    every time). Task data and config are frozen while a worker serves them, and a worker starts thousands of
    episodes of the same tasks, so per-task values are computed once per task instead of once per episode."""
    try:
        return cache[task]
    except (KeyError, TypeError):
        pass
    value = compute(task)
    try:
        cache[task] = value
    except TypeError:
        pass
    return value


# ``(Task.key, Task.hash)``: a JSON dump and a sha256 of the task data, twice.
_IDENTITIES: weakref.WeakKeyDictionary[Any, tuple[str, str]] = weakref.WeakKeyDictionary()
# ``Task.hooks("stop")`` (verifiers walks the class hierarchy and the config's plugged functions on every call), with
# the task's own methods kept unbound: a bound one would keep its task, the cache key, alive.
_STOP_HOOKS: weakref.WeakKeyDictionary[Any, list[tuple[Any, bool]]] = weakref.WeakKeyDictionary()
_AGENT_CONFIG: list[vf.AgentConfig] = []


def _task_identity(task: vf.Task) -> tuple[str, str]:
    """``(task.key, task.hash)``, computed once per task object."""
    return _per_task(_IDENTITIES, task, lambda t: (t.key, t.hash))


def _unbound_stop_hooks(task: vf.Task) -> list[tuple[Any, bool]]:
    return [(h.__func__, True) if isinstance(h, types.MethodType) and h.__self__ is task else (h, False)
            for h in task.hooks("stop")]  # fmt: skip


def _stop_hooks(task: vf.Task) -> list[Any]:
    """``task.hooks("stop")``, looked up once per task object."""
    return [types.MethodType(fn, task) if bound else fn for fn, bound in _per_task(_STOP_HOOKS, task, _unbound_stop_hooks)]


def _default_agent_config() -> vf.AgentConfig:
    """A copy of the default ``vf.AgentConfig`` (validating a fresh one costs ~0.1 ms; a shallow copy ~µs)."""
    if not _AGENT_CONFIG:
        _AGENT_CONFIG.append(vf.AgentConfig())
    return _AGENT_CONFIG[0].model_copy()


class Episode:
    """The environment side of one rollout of one task: ``start`` -> (``step``)* -> ``finish``.

    ``max_turns`` bounds assistant turns (the orchestrator records truncation when the task wanted more).
    """

    def __init__(self, task: vf.Task, *, max_turns: int | None = None) -> None:
        self.task = task
        self.max_turns = max_turns
        key, content_hash = _task_identity(task)
        self.trace = vf.Trace(
            task=vf.TraceTask(type=type(task).__name__, data=task.data, key=key, hash=content_hash),
            agent=vf.AgentInfo(config=_default_agent_config()),
        )
        self.messages: list[dict[str, str]] = []
        self.turns = 0
        self.wants_more = False

    def _append(self, role: str, content: str, *, sampled: bool = False) -> None:
        parent = len(self.trace.nodes) - 1 if self.trace.nodes else None
        self.trace.nodes.append(
            vf.MessageNode(parent=parent, message=_message(role, content), sampled=sampled)
        )
        self.messages.append({"role": role, "content": content})

    async def start(self) -> list[dict[str, str]]:
        """Run the task's ``setup`` and return the first messages. Raises TaskError."""
        try:
            await self.task.setup(self.trace, None)
            first = initial_messages(self.task.data)
        except Exception as exc:
            raise as_srl_error(exc, srl_errors.TaskError, "task setup") from exc
        for m in first:
            self._append(m["role"], m["content"])
        return list(self.messages)

    async def step(self, reply: str) -> tuple[list[dict[str, str]], bool]:
        """Record the policy's ``reply``; return (new user messages, done). Raises TaskError."""
        self._append("assistant", reply, sampled=True)
        self.turns += 1
        try:
            if await self._stopped():
                return [], True
            user_turn = getattr(self.task, "user_turn", None)
            nxt = await user_turn(self.trace) if callable(user_turn) else None
        except Exception as exc:
            raise as_srl_error(exc, srl_errors.TaskError, "task user turn") from exc
        if nxt is None:
            return [], True
        if self.max_turns is not None and self.turns >= self.max_turns:
            self.wants_more = True  # the task had another turn: truncated by max_turns
            return [], True
        self._append("user", nxt)
        return [self.messages[-1]], False

    async def _stopped(self) -> bool:
        available = {"task": self.task.data, "trace": self.trace}
        for fn in _stop_hooks(self.task):
            if _needs_only(fn, available):
                result = fn(**{k: v for k, v in available.items() if k in inspect.signature(fn).parameters})
                if inspect.isawaitable(result):
                    result = await result
                if result:
                    return True
        return False

    async def finalize(self) -> None:
        """Run the task's ``finalize`` hook. Raises TaskError."""
        try:
            await self.task.finalize(self.trace, None)
        except Exception as exc:
            raise as_srl_error(exc, srl_errors.TaskError, "task finalize") from exc

    async def score(self) -> dict[str, Any]:
        """Score the conversation: ``{"reward", "components", "metrics"}``.

        ``reward`` is verifiers' weighted sum (sum of score * weight); ``components`` maps each reward name to
        its unweighted score. Raises TaskError (a raising or unset reward function).
        """
        try:
            await self.task.score(self.trace)
        except Exception as exc:
            raise as_srl_error(exc, srl_errors.TaskError, "task scoring") from exc
        missing = [name for name, r in self.trace.rewards.items() if r is None]
        if missing:
            raise srl_errors.TaskError(f"task scoring left rewards unset: {missing}")
        return {
            "reward": float(self.trace.reward),
            "components": {name: float(r.score) for name, r in self.trace.rewards.items()},
            "metrics": {name: float(v) for name, v in self.trace.metrics.items() if v is not None},
        }
