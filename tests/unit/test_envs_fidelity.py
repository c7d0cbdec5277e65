"""Environment fidelity: ``harness.runtime`` reaches the env worker and the task, tasks are called the way
verifiers calls them, what the plain chat loop cannot play runs through verifiers' rollout, and what srl cannot
provide is refused when the env loads, naming the env and the feature."""

from __future__ import annotations

import asyncio
import shutil
import sys

import pytest
import verifiers.v1 as vf

from tests.vf_differential import fixtures_on_path
from toolkit import errors as srl_errors
from toolkit.envs import fidelity
from toolkit.envs.episode import Episode
from toolkit.envs.fidelity import EnvFeatureError

fixtures_on_path()


def _spec(taskset: dict, *, runtime: dict | None = None, harness: str = "default", name: str = "my-env") -> dict:
    ts = {
        "id": taskset["id"],
        "split": taskset.get("split"),
        "seed": 0,
        "select": None,
        "extra": {k: v for k, v in taskset.items() if k not in ("id", "split")},
    }
    return {
        "name": name,
        "taskset": ts,
        "harness": {"id": harness, "runtime": runtime or {"type": "subprocess"}},
        "max_turns": 1,
        "timeout": {},
    }


def test_env_spec_forwards_harness_runtime():
    from toolkit.config.model import EnvConfig
    from toolkit.envs.runtime import env_spec

    cfg = EnvConfig(taskset={"id": "srl-reverse-text"}, harness={"id": "default", "runtime": {"type": "subprocess"}})
    spec = env_spec(cfg.model_copy(update={"name": cfg.env_name}))
    assert spec["harness"] == {"id": "default", "runtime": {"type": "subprocess"}}


def test_worker_hands_its_runtime_to_setup_and_scoring():
    from toolkit.envs.server import EnvWorker

    worker = EnvWorker(_spec({"id": "exec-check", "dataset_split": "test", "num_examples": 2}))
    assert worker.runtime_config.type == "subprocess"

    async def run() -> dict:
        started = await worker.handle("start", {"example_id": 0, "episode": "e0"})
        assert started["task_id"] == "idx:0"  # rows with only idx are named by it
        episode = worker.episodes["e0"]
        assert type(episode.runtime).__name__ == "SubprocessRuntime"
        answer = str(worker.tasks[0].data.answer)
        await worker.handle("step", {"episode": "e0", "reply": answer})
        scored = await worker.handle("finish", {"episode": "e0"})
        assert episode.runtime is None  # stopped with the episode
        return scored

    scored = asyncio.run(run())
    assert scored["reward"] == 1.0 and scored["components"] == {"checked": 1.0}
    assert scored["stop_condition"] == "agent_completed"


@pytest.mark.parametrize(
    "runtime,needle",
    [
        ({"type": "prime"}, "runtime type 'prime' is a remote sandbox"),
        ({"type": "modal"}, "runtime type 'modal' is a remote sandbox"),
        ({"type": "local"}, "runtime type 'local' is not a verifiers runtime"),
        ({"type": "subprocess", "cpu": 2}, "harness.runtime does not fit verifiers' 'subprocess' runtime config (cpu"),
    ],
)
def test_runtime_srl_cannot_provide_is_refused_naming_env(runtime, needle):
    with pytest.raises(EnvFeatureError) as err:
        fidelity.build_runtime_config("my-env", runtime)
    assert str(err.value).startswith("env 'my-env': harness.runtime") and needle in str(err.value)


def test_container_runtime_needs_its_program_on_the_node(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(EnvFeatureError, match="'apptainer' program, which is not on PATH"):
        fidelity.build_runtime_config("hpc-env", {"type": "apptainer", "image": "docker://python:3.11"})
    monkeypatch.setattr(shutil, "which", lambda name: f"/usr/bin/{name}")
    cfg = fidelity.build_runtime_config("hpc-env", {"type": "apptainer", "image": "docker://python:3.11"})
    assert cfg.type == "apptainer" and cfg.image == "docker://python:3.11"


@pytest.mark.parametrize(
    "taskset_id,needle",
    [
        ("best-of-two", "exports its own Env class BestOfTwoEnv"),
        ("guess-user", "exports its own Env class GuessEnv"),
    ],
)
def test_an_own_env_class_runs_through_verifiers_rollout(taskset_id, needle):
    from toolkit.envs.server import EnvWorker
    from toolkit.models import resolve_model

    spec = {
        **_spec({"id": taskset_id}, name="researcher-env"),
        "policy": {"model_path": str(resolve_model("tiny-qwen3")), "renderer": {"name": "hermes"}},
    }
    worker = EnvWorker(spec)
    assert worker.mode == "trace" and type(worker.trace_env.env).__name__ == needle.split()[-1]
    assert any("env 'researcher-env'" in r and needle in r for r in worker.reasons), worker.reasons
    assert len(worker.tasks) == len(worker.trace_env.tasks) > 0


def test_a_harness_verifiers_cannot_load_is_refused():
    from toolkit.envs.server import EnvWorker

    with pytest.raises(EnvFeatureError, match="harness.id: ModuleNotFoundError: harness 'tool-agent' not found"):
        EnvWorker(_spec({"id": "srl-reverse-text"}, harness="tool-agent"))


def test_a_built_in_taskset_with_tools_loads_through_verifiers_own_loader():
    """verifiers imports a taskset by id; srl enters its built-ins where that import finds them, so a built-in with
    a tool server (and a built-in with another harness) runs through verifiers' rollout like an installed env."""
    from toolkit.envs.server import EnvWorker
    from toolkit.models import resolve_model

    policy = {"model_path": str(resolve_model("tiny-qwen3")), "renderer": {"name": "hermes"}}
    try:
        worker = EnvWorker({**_spec({"id": "srl-code-lookup", "split": "test"}, name="lookup"), "policy": policy})
        assert worker.mode == "trace" and any("serves tools" in r for r in worker.reasons), worker.reasons
        assert type(worker.trace_env.env.taskset).__name__ == "CodeLookupTaskset"
        assert len(worker.trace_env.tasks) == 100
        worker = EnvWorker({**_spec({"id": "srl-reverse-text"}, harness="bash"), "policy": policy})
        assert worker.mode == "trace" and type(worker.trace_env.harnesses[0]).__name__ == "BashHarness"
    finally:  # a worker process serves one env; here later tests install modules of these names
        for name in ("srl_code_lookup", "srl_reverse_text"):
            sys.modules.pop(name, None)


class _ImageData(vf.TaskData):
    pass


class _ContainerTask(vf.Task[_ImageData, vf.State, vf.TaskConfig]):
    NEEDS_CONTAINER = True


class _InterceptTask(vf.Task[_ImageData, vf.State, vf.TaskConfig]):
    @vf.intercept
    async def rewrite(self, request: vf.Request) -> None:
        return None

    @vf.stop
    async def too_long(self, response: vf.Response) -> bool:
        return False


def test_task_features_srl_cannot_honour_are_named():
    sub = vf.SubprocessConfig()
    problems = fidelity.task_problems("e", _ContainerTask(_ImageData(prompt="x")), sub)
    assert any("needs a container runtime" in p for p in problems)
    problems = fidelity.task_problems("e", _ContainerTask(_ImageData(prompt="x", image="python:3.11")), sub)
    assert any("requires image 'python:3.11'" in p for p in problems)
    problems = fidelity.task_problems("e", _InterceptTask(_ImageData(prompt="x")), sub)
    assert any("@vf.intercept hooks ['rewrite']" in p for p in problems)
    assert any("@vf.stop too_long takes a Response boundary" in p for p in problems)
    problems = fidelity.task_problems("e", _ContainerTask.__mro__[1](_ImageData()), sub)
    assert any("has no prompt and no user to open the conversation" in p for p in problems)


class _RuntimeRewardTask(vf.Task[_ImageData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def needs_box(self, trace: vf.Trace, runtime: vf.Runtime) -> float:
        return 1.0


def test_a_reward_left_unscored_is_its_own_error_class():
    async def run() -> None:
        ep = Episode(_RuntimeRewardTask(_ImageData(prompt="x")))
        await ep.start()
        await ep.step("y")
        await ep.finalize()
        await ep.close()  # no runtime left: verifiers would skip the reward
        await ep.score()

    with pytest.raises(srl_errors.RewardSkippedError, match="needs_box"):
        asyncio.run(run())


def test_preflight_refuses_a_runtime_type_srl_never_provides(tmp_path):
    from toolkit.config import ConfigError, load_config
    from toolkit.preflight import preflight

    p = tmp_path / "run.toml"
    p.write_text(
        '[[orchestrator.train.env]]\nname = "box"\ntaskset = { id = "srl-reverse-text" }\n'
        'harness = { id = "default", runtime = { type = "modal" } }\n'
    )
    with pytest.raises(ConfigError) as err:
        preflight(load_config([p]))
    issues = {i.path: i.message for i in err.value.issues}
    assert issues["orchestrator.train.env[0].harness.runtime.type"].startswith(
        "env 'box': runtime type 'modal' is a remote sandbox"
    )


def test_reward_skipped_crosses_the_worker_wire_with_its_class():
    from toolkit.envs.protocol import outcome, unwrap

    wire = outcome(srl_errors.RewardSkippedError("task scoring skipped ['needs_box']"))
    assert wire["error_class"] == "RewardSkippedError"
    with pytest.raises(srl_errors.RewardSkippedError) as err:
        unwrap(wire)
    assert err.value.error_class == "RewardSkippedError"
    from toolkit.run.types import TRANSIENT_ERRORS

    assert "RewardSkippedError" not in TRANSIENT_ERRORS  # deterministic: a retry would skip it again


class _UntypedStopTask(vf.Task[_ImageData, vf.State, vf.TaskConfig]):
    @vf.stop
    def done(self, trace) -> bool:
        return True


def test_a_stop_verifiers_cannot_call_is_refused_with_its_reason():
    (problem,) = fidelity.task_problems("e", _UntypedStopTask(_ImageData(prompt="x")), vf.SubprocessConfig())
    assert problem == (
        "env 'e': _UntypedStopTask's @vf.stop done would be refused by verifiers: "
        "done must have exactly one Request, Response, or Trace parameter"
    )


class _StopAtOnceTask(vf.Task[_ImageData, vf.State, vf.TaskConfig]):
    @vf.stop
    async def never_start(self, trace: vf.Trace) -> bool:
        return True

    @vf.reward
    async def replied(self, trace: vf.Trace) -> float:
        return float(bool(trace.last_reply))


def test_a_stop_that_fires_before_the_first_turn_fails_the_episode():
    # verifiers refuses the first model call: no reply, scored on nothing. srl always samples the first turn, so
    # the episode is an error instead of a reply verifiers would never have asked for.
    ep = Episode(_StopAtOnceTask(_ImageData(prompt="hi")))
    with pytest.raises(srl_errors.TaskError, match="@vf.stop never_start fired before the first model turn"):
        asyncio.run(ep.start())
    assert ep.trace.stop_condition == "never_start"


def test_reference_rows_of_a_tool_taskset_are_tool_call_conversations_with_the_servers_schema():
    """``srl sft make-data`` on a taskset whose tasks carry ``reference_messages``: each row is the prompt, the known
    episode (tool call, tool result, answer) and the function schema verifiers' chat program offers (the server's
    registered tool, named ``<server>_<tool>``)."""
    from types import SimpleNamespace

    from toolkit.envs.reference import reference_rows
    from toolkit.envs.tasksets.code_lookup import code_for

    ns = SimpleNamespace(
        id="srl-code-lookup", split="train", seed=3, select=None, model_extra={"num_train_examples": 5}
    )
    rows = reference_rows(ns)
    assert len(rows) == 5
    row = rows[0]
    key = row["prompt"][-1]["content"].removeprefix("Code for ").removesuffix("?")
    call, result, answer = row["completion"]
    assert call["tool_calls"][0]["function"] == {"name": "vault_lookup", "arguments": f'{{"key": "{key}"}}'}
    assert result == {"role": "tool", "tool_call_id": "call_0", "content": code_for(3, key, 4)}
    assert answer == {"role": "assistant", "content": code_for(3, key, 4)}
    (schema,) = row["tools"]
    assert schema["function"]["name"] == "vault_lookup"
    assert schema["function"]["parameters"]["required"] == ["key"]
