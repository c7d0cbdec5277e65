"""Which of srl's two episode paths runs a verifiers v1 environment, and the refusals for what neither can run.

An env worker plays verifiers' single-agent, tool-less chat loop itself (``toolkit.envs.episode``, in process:
``SingleAgentEnv`` with the ``null`` harness, turn by turn) when the environment declares nothing beyond it. Anything
more runs through verifiers' own rollout (``toolkit.envs.traces``: ``Env.run_episode``, its harness program,
interception and tool servers, with srl's policy as the model). :func:`chat_loop_reasons` lists what sends an
environment to verifiers' rollout:

- an ``Env`` subclass exported by the taskset's module (verifiers runs that class's ``run``/``finalize``),
- a harness bundled with the taskset, or a ``harness.id`` other than the plain chat loop,
- tool servers (``Task.toolsets`` / ``Taskset.toolsets``), ``@vf.intercept`` hooks, ``@vf.stop`` predicates on a
  ``Request`` or ``Response`` (they need verifiers' interception server between program and model),
- a task without a prompt and no srl ``user_turn`` hook (an Env must drive the interaction).

Refused on both paths (:class:`EnvFeatureError`, naming the env and the feature): a runtime type srl cannot provide
on the node (remote sandboxes; a container engine that is not installed), a harness id verifiers does not know,
and a task/runtime pairing verifiers itself refuses (``NEEDS_CONTAINER`` on subprocess, a task image on
subprocess).

The runtime (``harness.runtime``) is verifiers' own runtime class built from the config, one per episode, handed
to the task's ``setup``/``finalize`` and to ``Task.score`` exactly as verifiers' rollout does.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Mapping
from typing import Any

PLAIN_CHAT_HARNESSES = ("default", "null")
"""Harness ids of the plain chat loop srl plays (prime-rl's ``default`` is verifiers' ``null``)."""

LOCAL_RUNTIME_BINARIES: dict[str, str | None] = {
    "subprocess": None,
    "docker": "docker",
    "podman": "podman",
    "apptainer": "apptainer",
}
"""Runtime types srl provides, each with the program it needs on the node (None: nothing beyond Python)."""

REMOTE_RUNTIME_TYPES = ("prime", "modal", "e2b")
"""verifiers' remote sandbox runtimes: they need provider credentials and outbound network from the env workers,
which srl does not arrange on a compute node."""


class EnvFeatureError(ValueError):
    """An environment uses a verifiers feature srl cannot honour; the message names the env and the feature."""


def runtime_type_problem(runtime_type: str) -> str | None:
    """Why srl cannot provide runtime ``runtime_type`` on this node, or None when it can. Imports nothing.

    ``subprocess`` always works; ``docker``/``podman``/``apptainer`` need their program on ``PATH`` (checked here,
    so the answer is about the node this runs on); remote and unknown types are never provided.
    """
    if runtime_type in LOCAL_RUNTIME_BINARIES:
        binary = LOCAL_RUNTIME_BINARIES[runtime_type]
        if binary is not None and shutil.which(binary) is None:
            return f"runtime type '{runtime_type}' needs the '{binary}' program, which is not on PATH on this node"
        return None
    if runtime_type in REMOTE_RUNTIME_TYPES:
        return (
            f"runtime type '{runtime_type}' is a remote sandbox; srl provides only "
            f"{', '.join(repr(t) for t in LOCAL_RUNTIME_BINARIES)} (env workers get no provider credentials or "
            "tunnel)"
        )
    return (
        f"runtime type '{runtime_type}' is not a verifiers runtime; srl provides "
        f"{', '.join(repr(t) for t in LOCAL_RUNTIME_BINARIES)}"
    )


def config_runtime_problem(runtime_cfg: Any) -> tuple[str, bool] | None:
    """``(message, is_error)`` for a ``harness.runtime`` section srl cannot provide, judged on this machine
    without importing verifiers; None when it can. A type srl never provides is an error; a container program
    missing here is only a warning (the compute nodes may have it; the env worker checks again there)."""
    rtype = str(runtime_fields(runtime_cfg).get("type"))
    problem = runtime_type_problem(rtype)
    if problem is None:
        return None
    return problem, rtype not in LOCAL_RUNTIME_BINARIES


def plain_data(value: Any) -> Any:
    """A pydantic model, namespace, mapping or list/tuple as plain data (dicts and lists, recursively); any other
    value (None included) as it is."""
    if hasattr(value, "model_dump"):
        return value.model_dump()
    if isinstance(value, Mapping):
        return {k: plain_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_data(v) for v in value]
    if hasattr(value, "__dict__") and not isinstance(value, type):
        return {k: plain_data(v) for k, v in vars(value).items() if not k.startswith("_")}
    return value


def runtime_fields(runtime_cfg: Any) -> dict[str, Any]:
    """srl's ``harness.runtime`` section as the plain fields verifiers' runtime config takes: every field the user
    set (None values dropped), so a field verifiers' class does not declare is refused, never dropped."""
    out = {k: v for k, v in (plain_data(runtime_cfg) or {}).items() if v is not None}
    out.setdefault("type", "subprocess")
    return out


def build_runtime_config(env_name: str, fields: Mapping[str, Any]) -> Any:
    """verifiers' runtime config (``verifiers.v1.runtimes.RuntimeConfig``) for ``fields`` (see :func:`runtime_fields`).

    Raises EnvFeatureError naming ``env_name`` when the type cannot be provided here (a container type needs its
    program on PATH) or when verifiers' config class rejects a field.
    """
    from pydantic import TypeAdapter, ValidationError
    from verifiers.v1.runtimes import RuntimeConfig

    rtype = str(fields.get("type", "subprocess"))
    problem = runtime_type_problem(rtype)
    if problem is not None:
        raise EnvFeatureError(f"env '{env_name}': harness.runtime: {problem}")
    try:
        return TypeAdapter(RuntimeConfig).validate_python(dict(fields))
    except ValidationError as exc:
        issues = "; ".join(f"{'.'.join(str(p) for p in e['loc'][1:]) or 'runtime'}: {e['msg']}" for e in exc.errors())
        raise EnvFeatureError(
            f"env '{env_name}': harness.runtime does not fit verifiers' '{rtype}' runtime config ({issues})"
        ) from None


def exported(module: Any, base: type) -> list[type]:
    """The subclasses of ``base`` (not ``base`` itself) that ``module`` lists in ``__all__``."""
    return [
        obj
        for name in getattr(module, "__all__", ()) or ()
        if isinstance(obj := getattr(module, name, None), type) and issubclass(obj, base) and obj is not base
    ]


def env_class_problems(env_name: str, module: Any, harness_id: str) -> list[str]:
    """What the taskset's module (the one its id imports) declares beyond the plain chat loop: an ``Env`` class, a
    bundled harness; and a harness id other than the plain chat loop. Returns one message per finding (empty:
    the plain chat loop plays it); each sends the env to verifiers' rollout (:func:`chat_loop_reasons`)."""
    import verifiers.v1 as vf

    out: list[str] = []
    if harness_id not in PLAIN_CHAT_HARNESSES:
        out.append(
            f"env '{env_name}': harness '{harness_id}' is not the plain chat loop "
            f"({' or '.join(repr(h) for h in PLAIN_CHAT_HARNESSES)})"
        )
    for env_cls in exported(module, vf.Env):
        out.append(
            f"env '{env_name}': the taskset's module {module.__name__} exports its own Env class "
            f"{env_cls.__name__}, whose run()/setup()/finalize() verifiers runs"
        )
    for harness_cls in exported(module, vf.Harness):
        out.append(
            f"env '{env_name}': the taskset's module {module.__name__} bundles its own harness "
            f"{harness_cls.__name__}, which verifiers runs by default"
        )
    return out


def harness_id_problem(env_name: str, harness_id: str) -> str | None:
    """Why ``harness.id`` names no harness verifiers can load (None: the plain chat loop, or one it can)."""
    if harness_id in PLAIN_CHAT_HARNESSES:
        return None
    from verifiers.v1.utils.loaders import harness_class

    try:
        harness_class(harness_id)
    except Exception as exc:  # noqa: BLE001 - verifiers' own message says what it tried
        return f"env '{env_name}': harness.id: {type(exc).__name__}: {exc}"
    return None


def task_class_problems(env_name: str, taskset: Any, task_cls: type) -> list[str]:
    """Refusals that hold for every task of the taskset: tool servers, interception hooks, stop predicates that
    need the model request or response."""
    out: list[str] = []
    try:
        task_tools = task_cls.toolsets(taskset.config.task)
        shared_tools = type(taskset).toolsets(taskset.config)
    except Exception as exc:  # noqa: BLE001 - a toolsets() that raises is itself the finding
        task_tools, shared_tools = [f"toolsets() raised {type(exc).__name__}: {exc}"], []
    if task_tools or shared_tools:
        out.append(
            f"env '{env_name}': {task_cls.__name__} serves tools (Task.toolsets / Taskset.toolsets), which "
            "verifiers' tool servers host"
        )
    return out


def task_problems(env_name: str, task: Any, runtime_config: Any, harness: Any = None) -> list[str]:
    """What the plain chat loop cannot play of one task (:func:`task_hook_reasons`) and the pairing verifiers
    refuses (:func:`pairing_problems`; ``harness`` defaults to verifiers' ``null``)."""
    return task_hook_reasons(env_name, task) + pairing_problems(env_name, task, runtime_config, harness)


def pairing_problems(env_name: str, task: Any, runtime_config: Any, harness: Any = None) -> list[str]:
    """verifiers' own refusal of running ``task`` with ``harness`` (default ``null``) on ``runtime_config``."""
    from verifiers.v1.utils.compile import resolve_runtime_config, validate_pairing

    try:
        resolved = resolve_runtime_config(runtime_config, task)
        validate_pairing(harness or _null_harness(), type(task), resolved)
    except ValueError as exc:
        why = f"env '{env_name}': {exc} (srl: set harness.runtime.type to 'docker', 'podman' or 'apptainer'; "
        return [why + "remote sandboxes are not provided)"]
    return []


def task_hook_reasons(env_name: str, task: Any) -> list[str]:
    """What sends one task to verifiers' rollout: interception hooks, request/response stops, no prompt."""
    from verifiers.v1.session import hook_boundary
    from verifiers.v1.utils.decorators import discover_decorated

    out: list[str] = []
    name = type(task).__name__
    intercepts = [fn.__name__ for fn in discover_decorated(task, "intercept")]
    if intercepts:
        out.append(
            f"env '{env_name}': {name} has @vf.intercept hooks {intercepts}; they rewrite model requests inside "
            "verifiers' interception server, which srl's token-in/token-out loop does not run"
        )
    for fn in task.hooks("stop"):
        try:
            kind = hook_boundary(fn, allow_trace=True).__name__
        except TypeError as exc:
            out.append(f"env '{env_name}': {name}'s @vf.stop {fn.__name__} would be refused by verifiers: {exc}")
            continue
        if kind != "Trace":
            out.append(
                f"env '{env_name}': {name}'s @vf.stop {fn.__name__} takes a {kind} boundary; srl checks only "
                "stops over the Trace (a request/response stop needs verifiers' interception server)"
            )
    if task.data.prompt is None and not callable(getattr(task, "user_turn", None)):
        out.append(
            f"env '{env_name}': task {task_identity(task)!r} has no prompt and no user to open the conversation "
            "(verifiers needs an Env that drives an interaction for such a task)"
        )
    return out


def _null_harness() -> Any:
    from verifiers.v1.harnesses.null import NullHarness, NullHarnessConfig

    return NullHarness(NullHarnessConfig(id="null"))


MAX_LISTED = 10
"""Refusals listed at most in one error (a problem of every task would otherwise print once per task)."""


def chat_loop_reasons(env_name: str, taskset: Any, tasks: Iterable[Any], harness_id: str, module: Any) -> list[str]:
    """Why the plain chat loop cannot play this environment as verifiers would (empty: it can), each reason once:
    the findings of :func:`env_class_problems`, :func:`task_class_problems` and, per task,
    :func:`task_hook_reasons`. A non-empty list sends the env to verifiers' own rollout."""
    out = env_class_problems(env_name, module, harness_id)
    out += task_class_problems(env_name, taskset, type(taskset).task_type())
    for task in tasks:
        out += task_hook_reasons(env_name, task)
    return list(dict.fromkeys(out))


def raise_listed(problems: list[str]) -> None:
    """Raise EnvFeatureError listing the distinct ``problems`` (at most ``MAX_LISTED``, then a count); nothing
    when there are none."""
    problems = list(dict.fromkeys(problems))
    if problems:
        listed = problems[:MAX_LISTED]
        if len(problems) > MAX_LISTED:
            listed.append(f"... and {len(problems) - MAX_LISTED} more")
        raise EnvFeatureError("\n".join(listed))


def check_loaded(
    env_name: str,
    taskset: Any,
    tasks: Iterable[Any],
    harness_id: str,
    runtime_config: Any,
    module: Any,
) -> None:
    """Refuse an environment the plain chat loop cannot play as verifiers would (the callers that have only that
    loop: ``srl eval validate``). Checks the taskset's ``module`` (the one its id imports), its task class and
    every loaded task. Raises EnvFeatureError listing the distinct findings (at most ``MAX_LISTED``, then a
    count of the rest)."""
    tasks = list(tasks)
    problems = chat_loop_reasons(env_name, taskset, tasks, harness_id, module)
    harness = _null_harness()
    for task in tasks:
        problems += pairing_problems(env_name, task, runtime_config, harness)
    raise_listed(problems)


def task_identity(task: Any) -> str:
    """A task's id as verifiers' own views name tasks: ``data.id``, else ``data.name``, else ``idx:<n>`` when the
    taskset set an index, else the content key (``Task.key``). Unique within a taskset when the source's ids are."""
    data = task.data
    if data.id is not None:
        return str(data.id)
    if data.name is not None:
        return str(data.name)
    if data.idx is not None:
        return f"idx:{data.idx}"
    return str(task.key)
