"""One episode of the plain chat harness (``harness.id = "default"``, verifiers' ``null``), driven turn by turn.

srl samples the policy itself (token-in/token-out, see ``toolkit.envs.rollout``); this module holds the
environment half of an episode inside an env worker, calling the task the way verifiers' own rollout
(``verifiers.v1.rollout.Rollout``) does:

- a runtime per episode, built from ``harness.runtime`` with verifiers' runtime classes and resolved per task
  (``resolve_runtime_config``: the task's image, workdir, network policy, resources), started, given the task's
  ``runtime_env()``, and stopped when the episode ends;
- ``setup`` and ``finalize`` called by parameter name with ``trace`` and ``runtime`` (verifiers' ``invoke``), so
  ``setup(self, runtime)`` and ``setup(self, trace, runtime)`` both work;
- ``Task.score(trace, runtime)``: rewards and metrics that declare a ``runtime`` parameter are scored, never
  skipped; a reward or metric still unscored afterwards is ``RewardSkippedError``, not a silent 0;
- ``@vf.stop`` predicates over the ``Trace`` checked before each model turn, with verifiers' typed call
  (``call_hook``); the trace carries verifiers' stop condition names (``agent_completed``, the stop's name,
  ``max_turns``, ``user_closed``). One that fires before the first turn fails the episode (TaskError): verifiers
  would end it with no reply, srl's loop always samples the first turn.

Multi-turn is srl's own extension: after each assistant reply the harness calls the task's
``user_turn(trace) -> str | None`` if it defines one (None ends the episode, ``user_closed``). A task without
``user_turn`` is single-turn, as verifiers' chat program is: its one reply ends the run (``agent_completed``).

Failures of task code raise ``toolkit.errors.TaskError``; a task's own verifiers error keeps its class.
"""

from __future__ import annotations

import contextlib
import inspect
import types
import weakref
from typing import Any

import verifiers.v1 as vf
from verifiers.v1.errors import TaskError as VfTaskError
from verifiers.v1.errors import boundary
from verifiers.v1.runtimes import SubprocessConfig, make_runtime
from verifiers.v1.session import call_hook
from verifiers.v1.state import state_cls
from verifiers.v1.utils.compile import resolve_runtime_config
from verifiers.v1.utils.decorators import invoke

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


_MESSAGE_CLASSES = {"system": vf.SystemMessage, "user": vf.UserMessage, "assistant": vf.AssistantMessage}


def initial_messages(data: vf.TaskData) -> list[dict[str, str]]:
    """The chat the policy sees first: the task's system prompt, then its prompt (a string or messages)."""
    out: list[dict[str, str]] = []
    if data.system_prompt:
        out.append({"role": "system", "content": data.system_prompt})
    if isinstance(data.prompt, str):
        out.append({"role": "user", "content": data.prompt})
    elif data.prompt:
        out += [{"role": m.role, "content": vf.types.content_text(m.content) or ""} for m in data.prompt]
    return out


def _per_task(cache: weakref.WeakKeyDictionary, task: Any, compute: Any) -> Any:
    """``compute(task)``, kept in the weakly keyed ``cache`` (a task type that cannot be weakly referenced is computed
    every time). Task data and config are frozen while a worker serves them, and a worker starts thousands of
    episodes of the same tasks, so per-task values are computed once per task instead of once per episode."""
    with contextlib.suppress(KeyError, TypeError):
        return cache[task]
    value = compute(task)
    with contextlib.suppress(TypeError):
        cache[task] = value
    return value


# ``(Task.key, Task.hash)``: a JSON dump and a sha256 of the task data, twice.
_IDENTITIES: weakref.WeakKeyDictionary[Any, tuple[str, str]] = weakref.WeakKeyDictionary()
# ``Task.hooks("stop")`` (verifiers walks the class hierarchy and the config's plugged functions on every call), with
# the task's own methods kept unbound: a bound one would keep its task, the cache key, alive.
_STOP_HOOKS: weakref.WeakKeyDictionary[Any, list[tuple[Any, bool]]] = weakref.WeakKeyDictionary()
# The runtime config each task resolves to, per base config (the task's image, workdir, network and resources).
_RUNTIMES: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()
_AGENT_CONFIGS: dict[str, vf.AgentConfig] = {}
DEFAULT_RUNTIME = SubprocessConfig()
"""srl's runtime when the config names none (verifiers' own default is a remote sandbox, which srl does not
provide; see ``toolkit.envs.fidelity``)."""


def _unbound_stop_hooks(task: vf.Task) -> list[tuple[Any, bool]]:
    return [
        (h.__func__, True) if isinstance(h, types.MethodType) and h.__self__ is task else (h, False)
        for h in task.hooks("stop")
    ]


def _stop_hooks(task: vf.Task) -> list[Any]:
    """``task.hooks("stop")``, looked up once per task object."""
    hooks = _per_task(_STOP_HOOKS, task, _unbound_stop_hooks)
    return [types.MethodType(fn, task) if bound else fn for fn, bound in hooks]


def task_runtime_config(task: vf.Task, base: Any) -> Any:
    """verifiers' runtime config of ``task`` under the env's ``base`` config, resolved once per (task, base).

    Raises ValueError where verifiers refuses the pair (a task image on the subprocess runtime, say).
    """
    key = base.model_dump_json()
    per_base = _per_task(_RUNTIMES, task, lambda t: {})
    if key not in per_base:
        per_base[key] = resolve_runtime_config(base, task)
    return per_base[key]


def _agent_config(runtime_config: Any) -> vf.AgentConfig:
    """A copy of ``vf.AgentConfig(runtime=...)`` for the trace's agent record (validating a fresh one costs
    ~0.1 ms; a shallow copy ~µs)."""
    key = runtime_config.model_dump_json()
    if key not in _AGENT_CONFIGS:
        _AGENT_CONFIGS[key] = vf.AgentConfig(runtime=runtime_config)
    return _AGENT_CONFIGS[key].model_copy()


class Episode:
    """The environment side of one rollout of one task: ``start`` -> (``step``)* -> ``finalize`` -> ``score``,
    then ``close`` (always: it stops the episode's runtime).

    ``max_turns`` bounds assistant turns (the orchestrator records truncation when the task wanted more);
    ``runtime_config``: verifiers' runtime config from ``harness.runtime`` (default: subprocess).
    """

    def __init__(self, task: vf.Task, *, max_turns: int | None = None, runtime_config: Any = None) -> None:
        self.task = task
        self.max_turns = max_turns
        self.runtime_config = runtime_config if runtime_config is not None else DEFAULT_RUNTIME
        key, content_hash = _per_task(_IDENTITIES, task, lambda t: (t.key, t.hash))
        self.trace = vf.Trace(
            task=vf.TraceTask(type=type(task).__name__, data=task.data, key=key, hash=content_hash),
            state=state_cls(type(task))(),
            agent=vf.AgentInfo(config=_agent_config(self.runtime_config)),
        )
        self.runtime: Any = None
        self.messages: list[dict[str, str]] = []
        self.turns = 0
        self.wants_more = False
        self.multi_turn = callable(getattr(task, "user_turn", None))

    def _append(self, role: str, content: str, *, sampled: bool = False) -> None:
        parent = len(self.trace.nodes) - 1 if self.trace.nodes else None
        self.trace.nodes.append(
            vf.MessageNode(parent=parent, message=_MESSAGE_CLASSES[role](content=content), sampled=sampled)
        )
        self.messages.append({"role": role, "content": content})

    async def _open_runtime(self) -> Any:
        """Build, start and prepare the episode's runtime as verifiers' rollout does. Raises SandboxError (the
        runtime failed) or TaskError (verifiers refuses the task/runtime pair).

        A subprocess runtime that no hook of the task can see (no ``runtime`` parameter on setup, finalize, a
        reward, a metric; no judges) is not created: it would only be a directory made and removed per episode
        (~0.4 ms of CPU), with no effect on what the task computes.
        """
        try:
            config = task_runtime_config(self.task, self.runtime_config)
        except ValueError as exc:
            raise srl_errors.TaskError(f"task runtime: {exc}") from exc
        if config.type == "subprocess" and not _per_task(_USES_RUNTIME, self.task, _uses_runtime):
            return None
        runtime = make_runtime(config, name=self.trace.id)
        self.runtime = runtime
        self.trace.agent.runtime = runtime.info
        try:
            runtime.env = dict(self.task.runtime_env())
            await runtime.start()
            await runtime.prepare_setup()
        except Exception as exc:
            raise as_srl_error(exc, srl_errors.SandboxError, f"runtime {config.type} start") from exc
        return runtime

    async def start(self) -> list[dict[str, str]]:
        """Start the runtime, run the task's ``setup(trace=, runtime=)`` and return the first messages.

        Raises SandboxError (runtime start) or TaskError (setup, or a task with no prompt and no ``user_turn``).
        """
        runtime = await self._open_runtime()
        try:
            if self.task.data.prompt is None and not self.multi_turn:
                raise VfTaskError("task has no prompt and no user to open the conversation")
            async with boundary(VfTaskError, "task setup"):
                await invoke(self.task.setup, {"trace": self.trace, "runtime": runtime})
            first = initial_messages(self.task.data)
        except Exception as exc:
            raise as_srl_error(exc, srl_errors.TaskError, "task setup") from exc
        if runtime is not None:
            # verifiers applies the runtime's execution policy (egress rules) once setup is done; what runs in the
            # runtime afterwards (finalize, scoring) runs under it. No program of srl's calls out from the
            # runtime, so no routes are opened for one.
            try:
                await runtime.prepare_execution([])
            except Exception as exc:
                raise as_srl_error(exc, srl_errors.SandboxError, "runtime execution policy") from exc
        # verifiers checks the stops before every model call, the first included; a stop that fires here would end
        # its episode without any reply. srl samples every episode's first turn, so such an episode is an error
        # rather than a reply verifiers would never have asked for.
        try:
            stopped = await self._stopped()
        except Exception as exc:
            raise as_srl_error(exc, srl_errors.TaskError, "task stop") from exc
        if stopped is not None:
            self.trace.stop(stopped)
            raise srl_errors.TaskError(
                f"@vf.stop {stopped} fired before the first model turn: verifiers would end this episode without a "
                "reply, and srl does not run an episode without one"
            )
        for m in first:
            self._append(m["role"], m["content"])
        return list(self.messages)

    async def step(self, reply: str) -> tuple[list[dict[str, str]], bool]:
        """Record the policy's ``reply``; return (new user messages, done). Raises TaskError."""
        self._append("assistant", reply, sampled=True)
        self.turns += 1
        if not self.multi_turn:
            # verifiers' chat program exits after a reply without tool calls: no further model call, so no
            # stop predicate runs again.
            self.trace.stop("agent_completed")
            return [], True
        try:
            stopped = await self._stopped()
            if stopped is not None:
                self.trace.stop(stopped)
                return [], True
            nxt = await self.task.user_turn(self.trace)
        except Exception as exc:
            raise as_srl_error(exc, srl_errors.TaskError, "task user turn") from exc
        if nxt is None:
            self.trace.stop("user_closed")
            return [], True
        if self.max_turns is not None and self.turns >= self.max_turns:
            self.wants_more = True  # the task had another turn: truncated by max_turns
            self.trace.stop("max_turns")
            return [], True
        self._append("user", nxt)
        return [self.messages[-1]], False

    async def _stopped(self) -> str | None:
        """The name of the first ``@vf.stop`` over the trace that fires, else None (verifiers' order: priority,
        then name). Raises verifiers' TaskError for a predicate that does not return a bool."""
        for fn in _stop_hooks(self.task):
            result = await call_hook(fn, {vf.Trace: self.trace})
            if not isinstance(result, bool):
                raise VfTaskError(f"@stop must return bool, got {type(result).__name__}")
            if result:
                return fn.__name__
        return None

    async def finalize(self) -> None:
        """Run the task's ``finalize(trace=, runtime=)``. Raises TaskError."""
        try:
            async with boundary(VfTaskError, "task finalize"):
                await invoke(self.task.finalize, {"trace": self.trace, "runtime": self.runtime})
        except Exception as exc:
            raise as_srl_error(exc, srl_errors.TaskError, "task finalize") from exc

    async def score(self) -> dict[str, Any]:
        """Score the conversation with ``Task.score(trace, runtime)``: ``{"reward", "components", "metrics",
        "stop_condition"}``.

        ``reward`` is verifiers' weighted sum (sum of score * weight); ``components`` maps each reward name to
        its unweighted score. Raises TaskError (a raising reward or metric) or RewardSkippedError (a reward or
        metric left unscored, e.g. one that needs a runtime when none was given).
        """
        try:
            await self.task.score(self.trace, self.runtime)
        except Exception as exc:
            raise as_srl_error(exc, srl_errors.TaskError, "task scoring") from exc
        missing = [name for name, r in self.trace.rewards.items() if r is None]
        missing += [name for name, v in self.trace.metrics.items() if v is None]
        uses_runtime = _per_task(_USES_RUNTIME, self.task, _uses_runtime)
        if missing or (self.runtime is None and uses_runtime and _runtime_signals(self.task)):
            skipped = sorted(set(missing) | set(_runtime_signals(self.task) if self.runtime is None else ()))
            raise srl_errors.RewardSkippedError(
                f"task scoring skipped {skipped}: verifiers leaves a signal unscored when it needs a runtime and "
                "none was given"
            )
        return {
            "reward": float(self.trace.reward),
            "components": {name: float(r.score) for name, r in self.trace.rewards.items()},
            "metrics": {name: float(v) for name, v in self.trace.metrics.items() if v is not None},
            "stop_condition": self.trace.stop_condition,
        }

    async def close(self) -> None:
        """Stop the episode's runtime (idempotent; a teardown failure is not the rollout's)."""
        runtime, self.runtime = self.runtime, None
        if runtime is not None:
            with contextlib.suppress(Exception):  # teardown after scoring must not fail a scored rollout
                await runtime.stop()


def _uses_runtime(task: vf.Task) -> bool:
    """Whether any hook verifiers calls with a runtime could receive one: an overridden ``setup``/``finalize`` or
    a reward/metric with a ``runtime`` parameter (defaulted or not), or configured judges."""
    for name in ("setup", "finalize"):
        if getattr(type(task), name) is not getattr(vf.Task, name) and (
            "runtime" in inspect.signature(getattr(task, name)).parameters
        ):
            return True
    for attr in ("reward", "metric"):
        if any("runtime" in inspect.signature(fn).parameters for fn in task.hooks(attr)):
            return True
    return bool(task.config.judges)


_USES_RUNTIME: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def _runtime_signals(task: vf.Task) -> list[str]:
    """Names of the task's rewards and metrics that require a ``runtime`` argument (no default)."""
    out = []
    for attr in ("reward", "metric"):
        for fn in task.hooks(attr):
            param = inspect.signature(fn).parameters.get("runtime")
            if param is not None and param.default is inspect.Parameter.empty:
                out.append(fn.__name__)
    return out
