"""srl's policy as the model of verifiers' own rollout: a tool episode through ``vf.Agent.run``.

verifiers runs everything but the model call: its subprocess runtime, its ``null`` harness chat program
(``offline_chat``: the same program run by this interpreter instead of a uv-provisioned one), its interception
server, and the task's ``vf.Toolset`` as a real MCP server process (``codebook_lookup``). srl's
``PolicyModelClient`` renders each request to token ids with the tiny model's ``hermes`` renderer and asks a
scripted policy (the fake stands in for the engine only: it answers by reading the prompt ids it is given) that
first calls the tool, then answers with what the tool returned.
"""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from tests.vf_differential import FIXTURES, fixtures_on_path
from toolkit.errors import ProviderError
from toolkit.run.types import Generation

fixtures_on_path()

TOOL_RESPONSE = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.DOTALL)


@pytest.fixture(scope="module")
def renderer():
    from toolkit.models import resolve_model
    from toolkit.models.renderer import HermesRenderer

    return HermesRenderer(resolve_model("tiny-qwen3"))


class ScriptedPolicy:
    """Turn 1: a tool call for the animal named in the prompt; later turns: the last tool response's text. Each
    call gets the next policy version (first ``first_version``) and distinct logprobs."""

    def __init__(self, renderer, first_version: int = 7, fail: bool = False) -> None:
        self.renderer = renderer
        self.version = first_version
        self.fail = fail
        self.turns: list[tuple[list[int], list[int], list[float], int]] = []
        self.max_tokens: list[int] = []

    async def generate(self, prompt_ids, sampling, *, session_id):
        if self.fail:
            raise ProviderError("engine unreachable after the retry budget")
        assert sampling.stop_token_ids == self.renderer.stop_token_ids
        self.max_tokens.append(sampling.max_tokens)
        text = self.renderer.decode(prompt_ids)
        responses = TOOL_RESPONSE.findall(text)
        if responses:
            reply = responses[-1]
        else:
            animal = re.search(r"code word for (\w+)", text).group(1)
            call = {"name": "codebook_lookup", "arguments": {"key": animal}}
            # Spelled more tightly than the template would write it back: a re-rendered history would not
            # extend the sampled ids, so exact prefix identity needs the sampled ids kept as they are.
            reply = f"<tool_call>{json.dumps(call, separators=(',', ':'))}</tool_call>"
        ids = self.renderer.encode(reply) + [self.renderer.stop_token_ids[0]]
        logprobs = [-0.5 - len(self.turns) - i / 1000 for i in range(len(ids))]
        self.turns.append((list(prompt_ids), ids, logprobs, self.version))
        self.version += 1
        return Generation(ids, logprobs, "stop", policy_version=self.turns[-1][3])


def _run_episode(policy, renderer, monkeypatch):
    """One rollout of the codebook task for "otter" through verifiers' ``Agent.run``; returns (trace, client)."""
    import verifiers.v1 as vf
    from codebook_lookup import CodebookConfig, CodebookTaskset
    from offline_chat import OfflineChatConfig
    from verifiers.v1.runtimes import SubprocessConfig

    from toolkit.envs.policy_client import PolicyClientConfig, PolicyInterceptionServer, PolicyModelClient

    # The tool server runs as `python -m codebook_lookup` in the runtime, which inherits this environment.
    monkeypatch.setenv("PYTHONPATH", str(FIXTURES))
    task = next(t for t in CodebookTaskset(CodebookConfig()) if t.data.animal == "otter")
    client = PolicyModelClient(policy.generate, renderer)
    server = PolicyInterceptionServer({"policy": client})
    config = vf.AgentConfig(
        harness=OfflineChatConfig(), runtime=SubprocessConfig(), model="tiny", client=PolicyClientConfig(), max_turns=4
    )

    async def run():
        async with server, vf.Agent(config, interception=server) as agent:
            return await agent.run(task)

    return asyncio.run(run()), client


def test_a_tool_episode_runs_through_verifiers_with_srl_owning_the_model_call(renderer, monkeypatch):
    from verifiers.v1.types import AssistantMessage, ToolMessage

    from toolkit.envs.policy_client import trace_samples

    policy = ScriptedPolicy(renderer)
    trace, client = _run_episode(policy, renderer, monkeypatch)

    assert trace.errors == []
    assert trace.reward == 1.0 and trace.stop_condition == "agent_completed"
    # The trace holds the model's tool call, verifiers' tool result from the MCP server, and the final answer.
    messages = [n.message for n in trace.nodes]
    calls = [m for m in messages if isinstance(m, AssistantMessage) and m.tool_calls]
    results = [m for m in messages if isinstance(m, ToolMessage)]
    assert [(c.name, json.loads(c.arguments)) for c in calls[0].tool_calls] == [("codebook_lookup", {"key": "otter"})]
    assert [(r.tool_call_id, r.content) for r in results] == [(calls[0].tool_calls[0].id, "maple")]
    assert trace.last_reply == "maple"

    # Two policy turns; the first prompt is the whole conversation with the tool schema rendered in it, the
    # second extends the first prompt + completion exactly (only the tool result and generation prompt appended).
    (p1, c1, l1, v1), (p2, c2, l2, v2) = policy.turns
    assert '"name": "codebook_lookup"' in renderer.decode(p1)
    assert p2[: len(p1) + len(c1)] == p1 + c1
    assert renderer.decode(p2[len(p1) + len(c1) :]).startswith("\n<|im_start|>user\n<tool_response>\nmaple\n")
    assert (client.rendered_turns, client.bridged_turns) == (1, 1)

    # One trainable branch: the tokens the model saw, the mask True exactly on what it sampled, their logprobs.
    got = trace_samples(trace)
    assert len(got.samples) == 1 and got.policy_version == v1 < v2
    sample = got.samples[0]
    assert sample.prompt_ids == p1
    assert sample.prompt_ids + sample.completion_ids == p2 + c2
    bridge = len(p2) - len(p1) - len(c1)
    assert sample.completion_mask == [True] * len(c1) + [False] * bridge + [True] * len(c2)
    assert sample.completion_logprobs == l1 + [0.0] * bridge + l2

    # A seat the env marks untrainable gives nothing to train on.
    trace.agent.trainable = False
    assert trace_samples(trace).samples == []


def test_a_policy_failure_is_a_provider_error_on_the_trace(renderer, monkeypatch):
    trace, _ = _run_episode(ScriptedPolicy(renderer, fail=True), renderer, monkeypatch)
    assert [e.type for e in trace.errors] == ["ProviderError"]
    assert "engine unreachable" in trace.errors[0].message


# ------------------------------------------------------------------------------------------------------------
# The renderer half, without an episode
# ------------------------------------------------------------------------------------------------------------
def test_tool_calls_are_read_back_and_malformed_ones_stay_text():
    from toolkit.models.renderer import parse_tool_calls

    text = 'Let me look.\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    assert parse_tool_calls(text) == ("Let me look.", [{"name": "f", "arguments": '{"a": 1}'}])
    broken = "<tool_call>\n{not json}\n</tool_call>"
    assert parse_tool_calls(broken) == (broken, [])
    assert parse_tool_calls('<tool_call>{"arguments": {}}</tool_call>')[1] == []  # no name: not a call


@pytest.mark.parametrize("stopped", [True, False], ids=["stop-token", "cut-by-length"])
def test_the_continuation_keeps_sampled_ids_and_matches_a_whole_render(renderer, stopped):
    tools = [{"type": "function", "function": {"name": "f", "description": "", "parameters": {}}}]
    history = [{"role": "user", "content": "q"}]
    call = {"id": "c0", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    # The model spelled its call with other spacing than the template would: the ids stay as sampled.
    sampled = renderer.encode('<tool_call>{"name":"f","arguments":{"a":1}}</tool_call>')
    completion = sampled + ([renderer.stop_token_ids[0]] if stopped else [])
    tail = [{"role": "tool", "tool_call_id": "c0", "content": "2"}]
    prompt = renderer.render(history, tools=tools)
    more = renderer.continuation(
        [*history, {"role": "assistant", "content": None, "tool_calls": [call]}],
        tail,
        completion_ids=completion,
        tools=tools,
    )
    text = renderer.decode(more)
    assert (
        text == ("" if stopped else "<|im_end|>") + "\n<|im_start|>user\n<tool_response>\n2\n</tool_response>"
        "<|im_end|>\n<|im_start|>assistant\n"
    )
    # Spelled the template's way, the bridged prompt is exactly the whole render.
    canonical = renderer.encode('<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>')
    whole = renderer.render(
        [*history, {"role": "assistant", "content": None, "tool_calls": [call]}, *tail], tools=tools
    )
    assert prompt + canonical + completion[len(sampled) :] + more == whole


def test_env_episodes_run_through_verifiers_own_env_with_one_shared_policy_client(renderer, monkeypatch):
    """``Env.run_episode`` (the taskset's own Env class: ``SingleAgentEnv``) inside ``policy_serving``: two
    concurrent episodes on one interception server and one policy client keep their sessions apart."""
    import verifiers.v1 as vf
    from verifiers.v1.clients import ModelContext
    from verifiers.v1.utils.loaders import env_config_type, environment_class

    from toolkit.envs.policy_client import (
        PolicyClientConfig,
        PolicyModelClient,
        policy_serving,
        trace_samples,
    )

    monkeypatch.setenv("PYTHONPATH", str(FIXTURES))
    seat = {"harness": {"id": "offline_chat"}, "runtime": {"type": "subprocess"}}
    config = env_config_type("codebook-lookup").model_validate({"taskset": {"id": "codebook-lookup"}, "agent": seat})
    env = environment_class("codebook-lookup")(config)
    assert type(env).__name__ == "SingleAgentEnv"
    policy = ScriptedPolicy(renderer)
    client = PolicyModelClient(policy.generate, renderer)
    ctx = ModelContext(model="tiny", client=PolicyClientConfig(), sampling=vf.SamplingConfig(max_tokens=200))
    tasks = [t for t in env.taskset if t.data.animal in ("heron", "lynx")]

    async def run():
        async with policy_serving(env, {"policy": client}):
            return await asyncio.gather(*(env.run_episode(t, ctx) for t in tasks))

    episodes = asyncio.run(run())
    assert [e.ok for e in episodes] == [True, True]
    assert (client.rendered_turns, client.bridged_turns) == (2, 2)
    assert policy.max_tokens == [200] * 4  # the rollout's sampling config reaches the policy
    for task, episode in zip(tasks, episodes, strict=True):
        (trace,) = episode.traces
        assert trace.reward == 1.0
        (sample,) = trace_samples(trace).samples
        text = renderer.decode(sample.prompt_ids + sample.completion_ids)
        assert f"code word for {task.data.animal}?" in text and text.endswith(f"{task.data.answer}<|im_end|>")


def test_a_prompt_that_does_not_extend_the_last_turn_becomes_a_second_sample(renderer, monkeypatch):
    """A renderer that cannot continue the conversation (here: continuation refused) renders the second prompt
    whole; it does not extend the sampled ids (the policy spelled its call tighter than the template), so
    verifiers' graph starts a second branch and srl trains two samples, never stitched."""
    from toolkit.envs.policy_client import trace_samples

    monkeypatch.setattr(type(renderer), "continuation", lambda self, *a, **k: None)
    policy = ScriptedPolicy(renderer)
    trace, client = _run_episode(policy, renderer, monkeypatch)
    assert trace.errors == [] and trace.reward == 1.0
    assert (client.rendered_turns, client.bridged_turns) == (2, 0)
    (p1, c1, l1, v1), (p2, c2, l2, _) = policy.turns
    assert p2[: len(p1) + len(c1)] != p1 + c1
    got = trace_samples(trace)
    assert [(s.prompt_ids, s.completion_ids, s.completion_logprobs) for s in got.samples] == [
        (p1, c1, l1),
        (p2, c2, l2),
    ]
    assert all(all(s.completion_mask) for s in got.samples) and got.policy_version == v1
