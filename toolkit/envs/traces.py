"""Episodes through verifiers' own rollout in an env worker, with srl's policy as the model: ``TraceEnv``.

For an environment the plain chat loop (``toolkit.envs.episode``) cannot play as verifiers would (tool servers,
``@vf.intercept`` hooks, request/response stops, the taskset module's own ``Env`` or harness, another harness id),
the worker builds the environment the way verifiers does (``env_config_type`` / ``environment_class`` of the
taskset id, with the env's ``harness`` and ``runtime`` on its agent seats: :func:`seat_overrides`) and runs
``Env.run_episode`` inside ``policy_serving``: verifiers runs setup, the harness program, tool servers, stops,
interception and scoring; each model turn reaches srl's ``PolicyModelClient``, whose ``generate`` is a callback to the
orchestrator (the policy client, its retries and the policy version per turn stay there; ``toolkit.envs.protocol``).
What comes back per episode (:meth:`TraceEnv.run`) is one Rollout's fields per trainable trace (an Env that runs
several attempts, or several trainable seats, gives several): reward, reward components and metrics of the trace,
its turns and truncation (verifiers' ``Trace.is_truncated`` and stop condition), and its training samples, which
are ``Trace.branches`` (``policy_client.trace_samples``). A failed episode, or a failed model call of a trainable
trace, raises the srl error class of verifiers' error type (``ProviderError``, ``ToolsetError``, ``TaskError``).

The env's ``max_turns`` and ``max_total_tokens`` become the seats' limits of the same names, enforced by verifiers
(a trace it stops there is truncated, with verifiers' stop condition as the reason).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

from toolkit import errors as srl_errors
from toolkit.envs import registry
from toolkit.envs.fidelity import (
    exported,
    runtime_fields,
    task_identity,
)
from toolkit.envs.protocol import error_class
from toolkit.run.types import Generation, SamplingParams

VF_ERROR_CLASSES = {"EnvError": "TaskError", "InterceptionError": "HarnessError"}
"""verifiers error types without an srl class of the same name, and the srl class they count as."""


def srl_error(vf_type: str, message: str) -> srl_errors.SrlRolloutError:
    """The srl exception for a verifiers error type name (``ToolsetError`` -> ``toolkit.errors.ToolsetError``);
    an unknown type is a HarnessError (the harness program or the env's code failed)."""
    name = VF_ERROR_CLASSES.get(vf_type, vf_type)
    return error_class(name)(f"{vf_type}: {message}" if name != vf_type else message)


def seat_overrides(spec: dict[str, Any], config_cls: Any, bundles_harness: bool) -> dict[str, dict[str, Any]]:
    """What srl's env config sets on each agent seat of verifiers' env config class ``config_cls`` (every field
    whose default is an ``AgentConfig``: ``agent`` of a single-agent env, an Env's own seats), merged by verifiers
    onto the seat's declared defaults:

    - ``runtime``: the env's ``harness.runtime`` on every seat (verifiers' own default is a remote sandbox);
    - ``harness``: on a seat whose env leaves it unset, ``harness.id`` (``default`` means what srl's chat loop
      plays: verifiers' ``null``, or the harness the taskset bundles when it has one); a seat the env pinned to a
      harness keeps it;
    - ``max_turns``, ``max_total_tokens``: verifiers' seat limits of the same names, when set;
    - ``timeout``: the ``setup``, ``finalize`` and ``scoring`` stages of srl's ``timeout`` set off srl's defaults
      (``timeout_given`` in the spec) on the seats whose env leaves that stage unset, so a stage that runs over
      fails as verifiers fails it (its error class) rather than as the whole episode's timeout; a stage the env
      declared keeps its own bound.
    """
    from verifiers.v1.configs.agent import AgentConfig

    harness = spec.get("harness") or {}
    hid = str(harness.get("id") or "default")
    out: dict[str, dict[str, Any]] = {}
    for name, field in config_cls.model_fields.items():
        if not isinstance(field.default, AgentConfig):
            continue
        seat: dict[str, Any] = {"runtime": runtime_fields(harness.get("runtime"))}
        if field.default.harness is None and not (hid == "default" and bundles_harness):
            seat["harness"] = {"id": "null" if hid == "default" else hid}
        for limit in ("max_turns", "max_total_tokens"):
            if spec.get(limit) is not None:
                seat[limit] = int(spec[limit])
        given = spec.get("timeout") or {}
        # Not ``rollout``: srl's rollout timeout bounds the whole episode from the orchestrator (a HarnessError,
        # the episode cancelled in the worker); verifiers' own would end the solve attempt and score it.
        stages = {
            k: float(given[k])
            for k in spec.get("timeout_given") or ()
            if k != "rollout" and given.get(k) is not None and getattr(field.default.timeout, k, None) is None
        }
        if stages:
            seat["timeout"] = stages
        out[name] = seat
    return out


class TraceEnv:
    """One environment of an env worker, built and served as verifiers serves it (see the module docstring).

    ``spec``: the worker spec (``toolkit.envs.server``), with ``policy`` = ``{"model_path", "renderer": {"name",
    "import_path"}}`` for srl's renderer. Raises TasksetFieldError (taskset fields), ModuleNotFoundError,
    pydantic.ValidationError (an env or seat config verifiers rejects). An srl built-in taskset is entered where
    verifiers' loader finds it (:func:`toolkit.envs.registry.expose_to_verifiers`).
    """

    def __init__(self, spec: dict[str, Any]) -> None:
        import verifiers.v1 as vf
        from verifiers.v1.utils.loaders import env_config_type, environment_class

        from toolkit.envs.programs import use_job_interpreter
        from toolkit.envs.server import taskset_namespace

        self.name = spec.get("name") or spec["taskset"]["id"]
        tid = spec["taskset"]["id"]
        registry.expose_to_verifiers(tid)
        ns = taskset_namespace(spec["taskset"])
        _, ts_config = registry.taskset_config(ns, env_name=self.name, eval_env=bool(spec.get("eval")))
        config_cls = env_config_type(tid)
        bundles = bool(exported(registry.taskset_module(tid), vf.Harness))
        fields: dict[str, Any] = {"taskset": ts_config.model_dump(), **seat_overrides(spec, config_cls, bundles)}
        self.env = environment_class(tid)(config_cls.model_validate(fields))
        self.harnesses = _seat_harnesses(self.env)
        view = self.env.taskset.select(registry.select_config(ns.select, default_seed=ns.seed or 0))
        if not view.bounded:
            raise ValueError(f"taskset {tid!r} is infinite: bound it with select.limit")
        self.tasks = list(view)
        policy = spec.get("policy") or {}
        self.renderer = _renderer(policy)
        self.server: Any = None
        self._stack: contextlib.AsyncExitStack | None = None
        use_job_interpreter()

    async def start(self) -> None:
        """Bring up the env's shared tool servers, the interception server and ``env.start()``."""
        from toolkit.envs.policy_client import policy_serving

        self._stack = contextlib.AsyncExitStack()
        self.server = await self._stack.enter_async_context(policy_serving(self.env, {}))

    async def aclose(self) -> None:
        if self._stack is not None:
            stack, self._stack = self._stack, None
            await stack.aclose()

    async def run(self, example_id: int, episode_id: str, sampling: dict[str, Any], call: Any) -> dict[str, Any]:
        """One episode of task ``example_id``; ``sampling``: the rollout's ``SamplingParams`` as a dict;
        ``call(op, **params)``: the callback to the orchestrator. Returns ``{"traces": [Rollout fields, one per
        trainable trace]}`` (module docstring). Raises TaskError (bad example id, no trainable trace) or the srl
        class of the episode's error."""
        import verifiers.v1 as vf
        from verifiers.v1.clients import ModelContext

        from toolkit.envs.policy_client import PolicyClientConfig, PolicyModelClient

        if not 0 <= example_id < len(self.tasks):
            raise srl_errors.TaskError(f"example_id {example_id} out of range [0, {len(self.tasks)})")
        task = self.tasks[example_id]
        params = SamplingParams(**sampling)

        async def generate(prompt_ids: list[int], turn: SamplingParams, *, session_id: str) -> Generation:
            r = await call(
                "generate",
                episode=episode_id,
                prompt_ids=prompt_ids,
                session_id=session_id,
                sampling=dataclasses.asdict(turn),
            )
            return Generation(
                list(r["token_ids"]),
                [float(x) for x in r["logprobs"]],
                str(r["finish_reason"]),
                int(r["policy_version"]),
                foreign_version=r.get("foreign_version"),
            )

        self.server.policies[episode_id] = PolicyModelClient(generate, self.renderer, params)
        try:
            ctx = ModelContext(
                model="policy",
                client=PolicyClientConfig(policy=episode_id),
                sampling=vf.SamplingConfig(max_tokens=params.max_tokens),
            )
            episode = await self.env.run_episode(task, ctx)
        finally:
            self.server.policies.pop(episode_id, None)
        trainable = [t for t in episode.traces if t.agent.trainable]
        failed = next((t for t in trainable if t.has_error), None)
        if failed is not None or (not episode.ok and episode.last_error is not None):
            err = failed.errors[-1] if failed is not None and failed.errors else episode.last_error
            if err is None:
                raise srl_errors.HarnessError(
                    f"the episode failed without an error recorded (trace "
                    f"{getattr(failed, 'id', '?')}, stop {getattr(failed, 'stop_condition', None)!r})"
                )
            raise srl_error(err.type, err.message)
        if not trainable:
            raise srl_errors.TaskError(
                f"the episode ran no trainable seat (seats: {[t.agent.name for t in episode.traces]})"
            )
        for trace in trainable:
            # A model call that failed ends the program's loop early, yet verifiers may still complete and score
            # the trace: a reward of a conversation the policy never finished, caused by the infrastructure.
            failed_call = next((c for c in trace.calls if c.error is not None), None)
            if failed_call is not None:
                raise srl_error(failed_call.error.type, f"model call failed: {failed_call.error.message}")
        return {"traces": [_rollout_fields(task, trace) for trace in trainable]}


def _rollout_fields(task: Any, trace: Any) -> dict[str, Any]:
    """A Rollout's fields from one finished trainable trace (see the module docstring)."""
    from toolkit.envs.policy_client import trace_samples

    got = trace_samples(trace)
    timing = trace.timing
    return {
        "task_id": task_identity(task),
        "seat": trace.agent.name,
        "reward": float(trace.reward),
        "components": {k: float(r.value) for k, r in trace.rewards.items() if r is not None},
        "metrics": {k: float(v) for k, v in trace.metrics.items() if isinstance(v, (int, float))},
        "num_turns": trace.num_turns,
        "truncated": bool(trace.is_truncated),
        "truncation_reason": _truncation_reason(trace),
        "samples": [dataclasses.asdict(s) for s in got.samples],
        "policy_version": got.policy_version or 0,
        "foreign_version": got.foreign_version,
        "timings": {
            "setup": timing.setup.duration,
            "scoring": timing.scoring.duration,
            "generation": timing.agent.model.duration,
            "env": timing.agent.harness.duration,
        },
    }


LIMIT_STOPS = ("max_turns", "max_input_tokens", "max_output_tokens", "max_total_tokens", "compaction_failed")
"""verifiers' stop conditions that truncate a trace (a framework limit); any other truncation is a response cut by
its token limit."""


def _truncation_reason(trace: Any) -> str | None:
    """None for a complete trace; the limit verifiers stopped it at; else ``max_tokens`` (the last response was
    cut by its token limit)."""
    if not trace.is_truncated:
        return None
    return trace.stop_condition if trace.stop_condition in LIMIT_STOPS else "max_tokens"


def _seat_harnesses(env: Any) -> list[Any]:
    """The harness of each agent seat of the env (for verifiers' pairing check); an unset one resolves as
    verifiers resolves it (the taskset's bundled harness, else ``bash``)."""
    from verifiers.v1.configs.agent import agent_config_fields
    from verifiers.v1.configs.env import default_agent_harness
    from verifiers.v1.utils.loaders import load_harness

    return [
        load_harness(seat.harness or default_agent_harness(env.config.taskset.id))
        for seat in agent_config_fields(env.config).values()
    ]


def _renderer(policy: dict[str, Any]) -> Any:
    from types import SimpleNamespace

    from toolkit.models.renderer import load_renderer

    cfg = policy.get("renderer") or {}
    if not policy.get("model_path"):
        raise ValueError("env worker spec has no policy.model_path: the orchestrator must name the policy's model")
    return load_renderer(
        SimpleNamespace(name=cfg.get("name"), import_path=cfg.get("import_path")), policy["model_path"]
    )
