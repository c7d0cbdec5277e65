"""Differential: the same scripted replies through verifiers' own rollout and through srl's episode give the same
messages, rewards, reward components, metrics and stop condition (or error class), task by task, over srl's
single-turn built-ins and outside environments written the way verifiers' published ones are. Environments srl
cannot run as verifiers would are refused at load, never run with another meaning.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from tests.vf_differential import ScriptedModel, fixtures_on_path, run_srl, run_verifiers, verifiers_agent

fixtures_on_path()

# (taskset id, srl taskset fields, replies per task: "ref" = the task's own answer field)
CORPUS = [
    ("srl-reverse-text", {"split": "test", "num_test_examples": 3}, ["ref", "", "zz"]),
    ("srl-arith", {"split": "test", "num_test_examples": 3}, ["ref", "", "-1"]),
    ("exec-check", {"dataset_split": "test", "num_examples": 3}, ["ref", "", "oops"]),
    ("exec-check", {"dataset_split": "train", "num_examples": 2, "flaw": "reward_raises"}, ["ref"]),
    ("tagged-answer", {"split": "test"}, ["ref", "<answer>nowhere</answer>", "Paris"]),
    ("tagged-answer", {"split": "train", "flaw": "reward_raises"}, ["ref"]),
]


def _taskset_ns(taskset_id: str, fields: dict) -> SimpleNamespace:
    own = {k: fields[k] for k in ("split", "seed") if k in fields}
    extra = {k: v for k, v in fields.items() if k not in own}
    return SimpleNamespace(
        id=taskset_id,
        select=None,
        model_extra=extra,
        split=own.get("split", "train"),
        seed=own.get("seed", 0),
    )


def _reply(task, spec: str) -> str:
    return str(task.data.answer) if spec == "ref" else spec


@pytest.mark.parametrize("taskset_id,fields,replies", CORPUS, ids=[f"{c[0]}-{i}" for i, c in enumerate(CORPUS)])
def test_same_outcome_as_verifiers(taskset_id, fields, replies):
    from verifiers.v1.runtimes import SubprocessConfig

    from toolkit.envs.registry import load_tasks

    tasks = load_tasks(_taskset_ns(taskset_id, fields))
    assert tasks
    runtime = SubprocessConfig()

    async def run() -> list[tuple]:
        out = []
        async with ScriptedModel() as model, verifiers_agent(model, runtime) as agent:
            for task in tasks:
                for spec in replies:
                    reply = _reply(task, spec)
                    theirs = await run_verifiers(agent, model, task, reply)
                    ours = await run_srl(task, reply, runtime)
                    out.append((task.data, reply, theirs, ours))
        return out

    results = asyncio.run(run())
    for data, reply, theirs, ours in results:
        assert ours == theirs, f"{taskset_id} task {data.idx} reply {reply!r}"
    if "flaw" not in fields:  # the reference answer is a full solve on both sides, not a shared 0
        assert all(theirs.reward == 1.0 for data, reply, theirs, _ in results if reply == str(data.answer))


@pytest.mark.parametrize(
    "taskset_id,role,check",
    [
        # verifiers plays a simulated user for several turns: srl's single-agent loop would score one reply.
        ("guess-user", "assistant", lambda ep: [t.num_turns for t in ep.traces] == [4]),
        # verifiers runs two attempts per episode and records the better one: srl would run one.
        ("best-of-two", "solver", lambda ep: len(ep.traces) == 2 and "best_of_two" in ep.traces[0].metrics),
    ],
)
def test_env_classes_run_by_verifiers_go_to_verifiers_rollout_in_srl(taskset_id, role, check):
    from tests.vf_differential import run_verifiers_env
    from toolkit.envs.server import EnvWorker
    from toolkit.models import resolve_model

    async def run():
        async with ScriptedModel() as model:
            return await run_verifiers_env(model, taskset_id, role, "4")

    episode = asyncio.run(run())
    assert episode.ok and check(episode)
    # srl's plain chat loop would play a different episode: the worker serves the taskset's own Env instead.
    spec = {
        "name": taskset_id,
        "taskset": {"id": taskset_id, "split": None, "seed": 0, "select": None, "extra": {}},
        "harness": {"id": "default"},
        "max_turns": 8,
        "timeout": {},
        "policy": {"model_path": str(resolve_model("tiny-qwen3")), "renderer": {"name": "hermes"}},
    }
    worker = EnvWorker(spec)
    assert worker.mode == "trace" and any("exports its own Env" in r for r in worker.reasons)
    from verifiers.v1.utils.loaders import environment_class

    assert type(worker.trace_env.env) is environment_class(taskset_id)
