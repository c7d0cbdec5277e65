"""Run one task with scripted assistant replies through verifiers' own rollout and through srl's episode.

verifiers' side: ``verifiers.v1.Agent.run`` (what ``SingleAgentEnv`` runs per episode) with the
``scripted_chat`` harness (tests/fixtures/vf_envs), a subprocess runtime, and a local chat-completions server that
answers with the scripted reply. srl's side: ``toolkit.envs.episode.Episode`` (as the env worker plays it)
with the same runtime config. Both return an :class:`Outcome` that compares messages, reward, reward components,
metrics and the stop condition (or the error class).

For whole environments (an Env class, tools, hooks, a bundled harness) one script answers both of verifiers' own
``Env.run_episode`` (eval client, :class:`ScriptedServer`) and srl's ``TraceEnv`` (:class:`ScriptedPolicy`, which
reads only prompt ids): :func:`run_env_verifiers` and :func:`run_env_srl`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

FIXTURES = Path(__file__).parent / "fixtures" / "vf_envs"
KEY_VAR = "SRL_SCRIPTED_MODEL_KEY"


@dataclass
class Outcome:
    messages: list[tuple[str, str]]
    reward: float | None
    components: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    stop: str | None = None
    error: str | None = None


async def _serve_chat(answer) -> tuple[Any, str]:
    """Serve ``answer`` (an aiohttp handler) at ``POST /v1/chat/completions`` on a free loopback port; returns the
    app runner (``cleanup()`` stops it) and the OpenAI base URL."""
    from aiohttp import web

    app = web.Application()
    app.router.add_post("/v1/chat/completions", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/v1"


class ScriptedModel:
    """A chat-completions server on 127.0.0.1 that answers every request with ``self.reply``."""

    def __init__(self) -> None:
        self.reply = ""
        self.requests: list[dict[str, Any]] = []
        self._runner = None
        self.base_url = ""

    async def __aenter__(self) -> Self:
        from aiohttp import web

        async def answer(request: web.Request) -> web.Response:
            body = await request.json()
            self.requests.append(body)
            return web.json_response(
                {
                    "id": "scripted",
                    "object": "chat.completion",
                    "created": 0,
                    "model": body.get("model", "m"),
                    "choices": [
                        {"index": 0, "message": {"role": "assistant", "content": self.reply}, "finish_reason": "stop"}
                    ],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                }
            )

        self._runner, self.base_url = await _serve_chat(answer)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


def fixtures_on_path() -> None:
    if str(FIXTURES) not in sys.path:
        sys.path.insert(0, str(FIXTURES))


def _text(message: Any) -> str:
    from verifiers.v1.types import content_text

    return content_text(message.content) or ""


@contextlib.asynccontextmanager
async def verifiers_agent(model: ScriptedModel, runtime_config: Any):
    """verifiers' Agent with the scripted chat harness, pointed at ``model``."""
    fixtures_on_path()
    import verifiers.v1 as vf
    from scripted_chat import ScriptedChatConfig
    from verifiers.v1.configs.client import EvalClientConfig

    os.environ.setdefault(KEY_VAR, "scripted")
    config = vf.AgentConfig(
        harness=ScriptedChatConfig(),
        runtime=runtime_config,
        model="scripted",
        client=EvalClientConfig(base_url=model.base_url, api_key_var=KEY_VAR),
    )
    async with vf.Agent(config) as agent:
        yield agent


async def run_verifiers(agent: Any, model: ScriptedModel, task: Any, reply: str) -> Outcome:
    """One single-turn rollout of ``task`` through verifiers' own ``Agent.run``."""
    model.reply = reply
    trace = await agent.run(task)
    error = trace.errors[-1].type if trace.errors else None
    return Outcome(
        messages=[(n.message.role, _text(n.message)) for n in trace.nodes],
        reward=None if error else float(trace.reward),
        components={} if error else {k: float(r.score) for k, r in trace.rewards.items() if r is not None},
        metrics={} if error else {k: float(v) for k, v in trace.metrics.items() if v is not None},
        stop=None if error else trace.stop_condition,
        error=error,
    )


async def run_srl(task: Any, reply: str, runtime_config: Any) -> Outcome:
    """The same rollout through srl's episode (``Episode``, as an env worker plays it), the policy replaced by
    ``reply``."""
    from toolkit.envs.episode import Episode
    from toolkit.errors import SrlRolloutError

    episode = Episode(task, max_turns=1, runtime_config=runtime_config)
    try:
        await episode.start()
        _, done = await episode.step(reply)
        assert done, "a single-turn task ends after its reply"
        await episode.finalize()
        scored = await episode.score()
    except SrlRolloutError as exc:
        return Outcome([(m["role"], m["content"]) for m in episode.messages], None, error=exc.error_class)
    finally:
        await episode.close()
    return Outcome(
        messages=[(m["role"], m["content"]) for m in episode.messages],
        reward=scored["reward"],
        components=scored["components"],
        metrics=scored["metrics"],
        stop=scored["stop_condition"],
    )


async def run_verifiers_env(model: ScriptedModel, taskset_id: str, role: str, reply: str) -> Any:
    """One episode of the taskset's own ``Env`` class (verifiers' resolution), every agent seat on the scripted
    chat harness with a subprocess runtime; returns verifiers' ``Episode``."""
    fixtures_on_path()
    import verifiers.v1 as vf
    from verifiers.v1.clients import ModelContext
    from verifiers.v1.configs.client import EvalClientConfig
    from verifiers.v1.utils.loaders import env_config_type, environment_class

    os.environ.setdefault(KEY_VAR, "scripted")
    seat = {"harness": {"id": "scripted_chat"}, "runtime": {"type": "subprocess"}}
    config = env_config_type(taskset_id).model_validate({"taskset": {"id": taskset_id}, role: seat})
    env = environment_class(taskset_id)(config)
    client = EvalClientConfig(base_url=model.base_url, api_key_var=KEY_VAR)
    ctx = ModelContext(model="scripted", client=client, sampling=vf.SamplingConfig())
    model.reply = reply
    async with env.serving():
        return await env.run_episode(next(iter(env.taskset)), ctx)


# ------------------------------------------------------------------------------------------------------------
# Scripted conversations for whole environments: one script answers verifiers' eval client (over the loopback)
# and srl's policy (token ids), so both rollouts of an env can be compared turn for turn.
# ------------------------------------------------------------------------------------------------------------
Conversation = list[tuple[str, str]]
"""A conversation as a script reads it: ``(role, text)`` per message, tool results as role ``tool``, an
assistant's tool calls spelled into its text as Hermes ``<tool_call>`` blocks."""

_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_TOOL_RESPONSE = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.DOTALL)


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
    """A tool call as the model writes it (Hermes format)."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def split_tool_calls(text: str) -> tuple[str, list[tuple[str, str]]]:
    """``(content, [(name, arguments as JSON)])`` of a scripted reply: the Hermes tool-call blocks taken out."""
    calls = []
    for block in _TOOL_CALL.findall(text):
        call = json.loads(block)
        calls.append((call["name"], json.dumps(call.get("arguments") or {})))
    return _TOOL_CALL.sub("", text).strip(), calls


def wire_conversation(messages: list[dict[str, Any]]) -> Conversation:
    """The script's view of a chat-completions request body's ``messages``."""
    out: Conversation = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
        text = content or ""
        for call in m.get("tool_calls") or []:
            fn = call.get("function") or {}
            text += tool_call_text(fn.get("name", ""), json.loads(fn.get("arguments") or "{}"))
        out.append((m["role"], text))
    return out


def chatml_conversation(text: str) -> Conversation:
    """The script's view of a decoded ChatML prompt (the tiny model's Hermes template): the tool schemas are
    dropped from the system message, each ``<tool_response>`` becomes a ``tool`` message, and the trailing
    generation prompt is left out."""
    out: Conversation = []
    blocks = text.split("<|im_start|>")[1:]
    for i, block in enumerate(blocks):
        role, _, body = block.partition("\n")
        closed = "<|im_end|>" in body
        body = body.split("<|im_end|>")[0]
        if role == "assistant" and not closed and i == len(blocks) - 1:
            continue
        if role == "system":
            body = body.split("\n\n# Tools\n")[0]
        responses = _TOOL_RESPONSE.findall(body) if role == "user" else []
        if responses:
            out += [("tool", r) for r in responses]
            continue
        out.append((role, body))
    return out


class ScriptedServer:
    """A chat-completions server on 127.0.0.1 whose replies come from ``script(conversation)``; it answers plain
    and streamed requests (one chunk, as verifiers frames a whole turn) and turns Hermes tool-call blocks in the
    reply into OpenAI ``tool_calls``. ``requests`` keeps every request's conversation."""

    def __init__(self, script: Callable[[Conversation], str]) -> None:
        self.script = script
        self.requests: list[Conversation] = []
        self.base_url = ""
        self._runner: Any = None

    def _completion(self, body: dict[str, Any]) -> dict[str, Any]:
        conversation = wire_conversation(body.get("messages") or [])
        self.requests.append(conversation)
        content, calls = split_tool_calls(self.script(conversation))
        message: dict[str, Any] = {"role": "assistant", "content": content or None}
        if calls:
            message["tool_calls"] = [
                {"id": f"call_{len(self.requests)}_{i}", "type": "function", "function": {"name": n, "arguments": a}}
                for i, (n, a) in enumerate(calls)
            ]
        prompt_words = sum(len(text.split()) for _, text in conversation)
        return {
            "id": f"scripted-{len(self.requests)}",
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model", "scripted"),
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
            "usage": {
                "prompt_tokens": prompt_words,
                "completion_tokens": len(content.split()) + len(calls),
                "total_tokens": prompt_words + len(content.split()) + len(calls),
            },
        }

    async def __aenter__(self) -> Self:
        from aiohttp import web

        async def answer(request: web.Request) -> web.StreamResponse:
            body = await request.json()
            completion = self._completion(body)
            if not body.get("stream"):
                return web.json_response(completion)
            choice = completion["choices"][0]
            delta = dict(choice["message"])
            for i, call in enumerate(delta.get("tool_calls") or []):
                call["index"] = i
            chunk = {
                **{k: v for k, v in completion.items() if k != "choices"},
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": delta, "finish_reason": choice["finish_reason"]}],
            }
            events = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n"
            return web.Response(body=events.encode(), content_type="text/event-stream")

        self._runner, self.base_url = await _serve_chat(answer)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@dataclass
class PolicyTurn:
    """One turn srl's scripted policy sampled."""

    session_id: str
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    version: int


class ScriptedPolicy:
    """srl's policy for ``TraceEnv.run`` (its ``call("generate", ...)`` callback to the orchestrator), answering
    like an engine would: it reads only the prompt ids, decodes them, and samples ``script``'s reply (then the
    stop token); each turn gets the next policy version and logprobs of its own. ``turns`` logs every turn."""

    def __init__(self, renderer: Any, script: Callable[[Conversation], str]) -> None:
        self.renderer = renderer
        self.script = script
        self.turns: list[PolicyTurn] = []

    async def call(self, op: str, **params: Any) -> dict[str, Any]:
        assert op == "generate", op
        prompt = list(params["prompt_ids"])
        reply = self.script(chatml_conversation(self.renderer.decode(prompt)))
        ids = self.renderer.encode(reply) + [self.renderer.stop_token_ids[0]]
        limit = int(params["sampling"]["max_tokens"])
        finish = "length" if len(ids) > limit else "stop"
        ids = ids[:limit]
        version = len(self.turns) + 1
        logprobs = [-(version + i / 1000) for i in range(len(ids))]
        self.turns.append(PolicyTurn(params["session_id"], prompt, ids, logprobs, version))
        return {"token_ids": ids, "logprobs": logprobs, "finish_reason": finish, "policy_version": version}


def _seat_config(harness_id: str | None, max_turns: int) -> dict[str, Any]:
    seat: dict[str, Any] = {"runtime": {"type": "subprocess"}, "max_turns": max_turns}
    if harness_id is not None:
        seat["harness"] = {"id": harness_id}
    return seat


async def run_env_verifiers(
    server: ScriptedServer,
    taskset_id: str,
    fields: dict[str, Any],
    harness_id: str | None,
    max_turns: int,
    task_indices: list[int],
    concurrent: bool = False,
) -> list[Any]:
    """Episodes of the taskset's tasks ``task_indices`` through verifiers' own ``Env`` (the class verifiers
    resolves for the id, ``env.serving()``, ``run_episode``) with the eval client pointed at ``server``: every
    agent seat on ``harness_id`` (None: the seat's own or the taskset's bundled harness), a subprocess runtime and
    ``max_turns``. Returns verifiers' ``Episode``s in task order."""
    fixtures_on_path()
    import verifiers.v1 as vf
    from verifiers.v1.clients import ModelContext
    from verifiers.v1.configs.agent import AgentConfig
    from verifiers.v1.configs.client import EvalClientConfig
    from verifiers.v1.utils.loaders import env_config_type, environment_class

    os.environ.setdefault(KEY_VAR, "scripted")
    config_cls = env_config_type(taskset_id)
    seats = [n for n, f in config_cls.model_fields.items() if isinstance(f.default, AgentConfig)]
    config = config_cls.model_validate(
        {"taskset": {"id": taskset_id, **fields}, **{s: _seat_config(harness_id, max_turns) for s in seats}}
    )
    env = environment_class(taskset_id)(config)
    tasks = list(env.taskset)
    client = EvalClientConfig(base_url=server.base_url, api_key_var=KEY_VAR)
    ctx = ModelContext(model="scripted", client=client, sampling=vf.SamplingConfig())
    async with env.serving():
        if concurrent:
            return list(await asyncio.gather(*(env.run_episode(tasks[i], ctx) for i in task_indices)))
        return [await env.run_episode(tasks[i], ctx) for i in task_indices]


@dataclass
class SrlEpisode:
    """One episode of srl's ``TraceEnv``: what ``run`` returned (or the srl error class it raised) and the
    verifiers ``Episode`` it ran, taken from the env as it returned it."""

    result: dict[str, Any] | None
    error: str | None
    episode: Any


async def run_env_srl(
    policy: ScriptedPolicy,
    taskset_id: str,
    fields: dict[str, Any],
    harness_id: str,
    max_turns: int,
    task_indices: list[int],
    concurrent: bool = False,
    max_tokens: int = 512,
) -> list[SrlEpisode]:
    """The same episodes through srl's ``TraceEnv`` (the env worker's path to verifiers' rollout), its model
    calls answered by ``policy``; ``harness_id`` is srl's ``harness.id`` (``default``: the plain chat loop or the
    taskset's bundled harness). Returns one ``SrlEpisode`` per task, in task order."""
    fixtures_on_path()
    from toolkit.envs.traces import TraceEnv
    from toolkit.errors import SrlRolloutError
    from toolkit.models import resolve_model
    from toolkit.run.types import SamplingParams

    spec = {
        "name": taskset_id,
        "taskset": {"id": taskset_id, "split": None, "seed": 0, "select": None, "extra": dict(fields)},
        "harness": {"id": harness_id, "runtime": {"type": "subprocess"}},
        "max_turns": max_turns,
        "timeout": {},
        "policy": {"model_path": str(resolve_model("tiny-qwen3")), "renderer": {"name": "hermes"}},
    }
    env = TraceEnv(spec)
    episodes: dict[str, Any] = {}
    run_episode = env.env.run_episode

    async def recording(task: Any, ctx: Any, **kwargs: Any) -> Any:
        episode = await run_episode(task, ctx, **kwargs)
        episodes[ctx.client.policy] = episode
        return episode

    env.env.run_episode = recording
    sampling = dataclasses.asdict(SamplingParams(max_tokens=max_tokens))

    async def one(i: int) -> SrlEpisode:
        name = f"episode-{i}"
        try:
            result = await env.run(i, name, sampling, policy.call)
        except SrlRolloutError as exc:
            return SrlEpisode(None, exc.error_class, episodes.get(name))
        return SrlEpisode(result, None, episodes.get(name))

    await env.start()
    try:
        if concurrent:
            return list(await asyncio.gather(*(one(i) for i in task_indices)))
        return [await one(i) for i in task_indices]
    finally:
        await env.aclose()
