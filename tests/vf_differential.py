"""Run one task with scripted assistant replies through verifiers' own rollout and through srl's episode.

verifiers' side: ``verifiers.v1.Agent.run`` (what ``SingleAgentEnv`` runs per episode) with the
``scripted_chat`` harness (tests/fixtures/vf_envs), a subprocess runtime, and a local chat-completions server that
answers with the scripted reply. srl's side: ``toolkit.envs.episode.Episode`` (as the env worker plays it)
with the same runtime config. Both return an :class:`Outcome` that compares messages, reward, reward components,
metrics and the stop condition (or the error class).
"""

from __future__ import annotations

import contextlib
import os
import sys
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

        app = web.Application()
        app.router.add_post("/v1/chat/completions", answer)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        self.base_url = f"http://127.0.0.1:{port}/v1"
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
