"""Episodes through verifiers' own rollout in an env worker, with srl's policy as the model: ``TraceEnv``.

For an environment the plain chat loop (``toolkit.envs.episode``) cannot play as verifiers would (tool servers,
``@vf.intercept`` hooks, request/response stops, the taskset module's own ``Env`` or harness, another harness id),
the worker builds the environment the way verifiers does (``env_config_type`` / ``environment_class`` of the
taskset id, with the env's ``harness`` and ``runtime`` as its agent seat) and runs ``Env.run_episode`` inside
``policy_serving``: verifiers runs setup, the harness program, tool servers, stops, interception and scoring; each
model turn reaches srl's ``PolicyModelClient``, whose ``generate`` is a callback to the orchestrator (the policy
client, its retries and the policy version per turn stay there; ``toolkit.envs.protocol``).

What comes back per episode (:meth:`TraceEnv.run`) is a Rollout's fields: reward, reward components and metrics
of the trainable seat's trace, its turns and truncation (verifiers' ``Trace.is_truncated`` and stop condition),
and its training samples, which are ``Trace.branches`` (``policy_client.trace_samples``). A failed episode raises
the srl error class of verifiers' error type (``ProviderError``, ``ToolsetError``, ``TaskError``, ...).

The env's ``max_turns`` and ``max_total_tokens`` become the seat's limits of the same names, enforced by verifiers
(a trace it stops there is truncated, with verifiers' stop condition as the reason). Not yet: episodes with several
trainable seats (each such episode fails as TaskError, naming the seats).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

from toolkit import errors as srl_errors
from toolkit.envs import registry
from toolkit.envs.fidelity import EnvFeatureError, builtin_harness_problem, runtime_fields, task_identity
from toolkit.run.types import Generation, SamplingParams

VF_ERROR_CLASSES = {"EnvError": "TaskError", "InterceptionError": "HarnessError"}
"""verifiers error types without an srl class of the same name, and the srl class they count as."""


def srl_error(vf_type: str, message: str) -> srl_errors.SrlRolloutError:
    """The srl exception for a verifiers error type name (``ToolsetError`` -> ``toolkit.errors.ToolsetError``);
    an unknown type is a HarnessError (the harness program or the env's code failed)."""
    name = VF_ERROR_CLASSES.get(vf_type, vf_type)
    klass = getattr(srl_errors, name, None)
    if not (isinstance(klass, type) and issubclass(klass, srl_errors.SrlRolloutError)):
        klass = srl_errors.HarnessError
    return klass(f"{vf_type}: {message}" if name != vf_type else message)


def seat_config(spec: dict[str, Any]) -> dict[str, Any]:
    """The agent seat verifiers builds from the env spec: its ``harness`` (omitted for ``default``: the env's own
    default, a harness the taskset bundles or verifiers' ``null``), ``runtime``, ``max_turns`` and
    ``max_total_tokens``."""
    harness = spec.get("harness") or {}
    seat: dict[str, Any] = {"runtime": runtime_fields(harness.get("runtime"))}
    hid = harness.get("id") or "default"
    if hid != "default":
        seat["harness"] = {"id": hid}
    for limit in ("max_turns", "max_total_tokens"):  # verifiers' own limits of the seat, same names and meaning
        if spec.get(limit) is not None:
            seat[limit] = int(spec[limit])
    return seat


class TraceEnv:
    """One environment of an env worker, built and served as verifiers serves it (see the module docstring).

    ``spec``: the worker spec (``toolkit.envs.server``), with ``policy`` = ``{"model_path", "renderer": {"name",
    "import_path"}}`` for srl's renderer. Raises TasksetFieldError (taskset fields), ModuleNotFoundError,
    pydantic.ValidationError (an env or seat config verifiers rejects), EnvFeatureError (an srl built-in taskset,
    which verifiers cannot load by id).
    """

    def __init__(self, spec: dict[str, Any]) -> None:
        from verifiers.v1.utils.loaders import env_config_type, environment_class

        from toolkit.envs.programs import use_job_interpreter
        from toolkit.envs.server import taskset_namespace

        self.name = spec.get("name") or spec["taskset"]["id"]
        tid = spec["taskset"]["id"]
        harness_id = str((spec.get("harness") or {}).get("id") or "default")
        problem = builtin_harness_problem(self.name, tid, registry.taskset_source(tid).kind, harness_id)
        if problem is not None:
            raise EnvFeatureError(problem)
        ns = taskset_namespace(spec["taskset"])
        _, ts_config = registry.taskset_config(ns, env_name=self.name, eval_env=bool(spec.get("eval")))
        config_cls = env_config_type(tid)
        fields: dict[str, Any] = {"taskset": ts_config.model_dump()}
        if "agent" in config_cls.model_fields:
            fields["agent"] = seat_config(spec)
        self.env = environment_class(tid)(config_cls.model_validate(fields))
        self.harness = _seat_harness(self.env)
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
        ``call(op, **params)``: the callback to the orchestrator. Returns the Rollout fields (module docstring).
        Raises TaskError (bad example id, several trainable seats) or the srl class of the episode's error."""
        import verifiers.v1 as vf
        from verifiers.v1.clients import ModelContext

        from toolkit.envs.policy_client import PolicyClientConfig, PolicyModelClient, trace_samples

        if not 0 <= example_id < len(self.tasks):
            raise srl_errors.TaskError(f"example_id {example_id} out of range [0, {len(self.tasks)})")
        task = self.tasks[example_id]
        params = SamplingParams(**sampling)

        async def generate(prompt_ids: list[int], turn: SamplingParams, *, session_id: str) -> Generation:
            r = await call("generate", episode=episode_id, prompt_ids=prompt_ids, session_id=session_id,
                           sampling=dataclasses.asdict(turn))  # fmt: skip
            return Generation(list(r["token_ids"]), [float(x) for x in r["logprobs"]], str(r["finish_reason"]),
                              int(r["policy_version"]), foreign_version=r.get("foreign_version"))  # fmt: skip

        self.server.policies[episode_id] = PolicyModelClient(generate, self.renderer, params)
        try:
            ctx = ModelContext(model="policy", client=PolicyClientConfig(policy=episode_id),
                               sampling=vf.SamplingConfig(max_tokens=params.max_tokens))  # fmt: skip
            episode = await self.env.run_episode(task, ctx)
        finally:
            self.server.policies.pop(episode_id, None)
        trainable = [t for t in episode.traces if t.agent.trainable]
        failed = next((t for t in trainable if t.has_error), None)
        if failed is not None or (not episode.ok and episode.last_error is not None):
            err = failed.errors[-1] if failed is not None and failed.errors else episode.last_error
            raise srl_error(err.type, err.message)
        if len(trainable) != 1:
            seats = [t.agent.name for t in trainable]
            raise srl_errors.TaskError(f"the episode has {len(trainable)} trainable seats {seats}; srl trains "
                                       "episodes with exactly one trainable seat so far")  # fmt: skip
        trace = trainable[0]
        # A model call that failed ends the program's loop early, yet verifiers may still complete and score the
        # trace: a reward of a conversation the policy never finished, caused by the infrastructure. Not trained.
        failed_call = next((c for c in trace.calls if c.error is not None), None)
        if failed_call is not None:
            raise srl_error(failed_call.error.type, f"model call failed: {failed_call.error.message}")
        got = trace_samples(trace)
        timing = trace.timing
        return {
            "task_id": task_identity(task),
            "reward": float(trace.reward),
            "components": {k: float(r.value) for k, r in trace.rewards.items() if r is not None},
            "metrics": {k: float(v) for k, v in trace.metrics.items() if isinstance(v, (int, float))},
            "num_turns": trace.num_turns,
            "truncated": bool(trace.is_truncated),
            "truncation_reason": (trace.stop_condition or "max_tokens") if trace.is_truncated else None,
            "samples": [dataclasses.asdict(s) for s in got.samples],
            "policy_version": got.policy_version or 0,
            "foreign_version": got.foreign_version,
            "timings": {
                "setup": timing.setup.duration, "scoring": timing.scoring.duration,
                "generation": timing.agent.model.duration, "env": timing.agent.harness.duration,
            },
        }


def _seat_harness(env: Any) -> Any:
    """The harness of the env's trainable agent seat (for verifiers' pairing check), or None (``null``)."""
    from verifiers.v1.utils.loaders import load_harness

    agent = getattr(env.config, "agent", None)
    harness_cfg = getattr(agent, "harness", None)
    return load_harness(harness_cfg) if harness_cfg is not None else None


def _renderer(policy: dict[str, Any]) -> Any:
    from types import SimpleNamespace

    from toolkit.models.renderer import load_renderer

    cfg = policy.get("renderer") or {}
    if not policy.get("model_path"):
        raise ValueError("env worker spec has no policy.model_path: the orchestrator must name the policy's model")
    return load_renderer(SimpleNamespace(name=cfg.get("name"), import_path=cfg.get("import_path")),
                         policy["model_path"])  # fmt: skip
