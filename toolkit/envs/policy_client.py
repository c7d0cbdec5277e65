"""srl's model client for verifiers' own rollout: token-in/token-out against srl's policy, versions per turn.

verifiers runs the episode (``Env.run_episode`` / ``Agent.run``: runtime, harness program, tool servers, stops,
scoring); its interception server receives every model request of the harness program, resolves a ``Client`` for
the rollout's client config and commits the returned ``Response`` (with its ``TurnTokens``) into the trace's
message graph. This module supplies that client, so srl owns only the model call:

- ``PolicyClientConfig``: the client config that selects srl's policy. A ``TrainClientConfig`` subclass, so the
  interception server generates streamed requests whole (as for verifiers' own train client) instead of relaying.
- ``PolicyModelClient``: renders the chat request (messages and tools) to prompt ids with srl's renderer
  (``toolkit.models.renderer``), keeping the previous turn's prompt + completion ids as the exact prefix of the
  next prompt (the graph's prompt prefix from verifiers' ``PendingTurn``, then only the new tail rendered), calls
  the injected policy ``generate(prompt_ids, sampling, session_id=...) -> Generation``, reads Hermes-format tool
  calls from the completion, and records the policy version of the turn on the trace (``trace.info``).
- ``PolicyInterceptionServer``: verifiers' ``InterceptionServer`` whose ``_client`` answers a
  ``PolicyClientConfig`` with the policy client (other configs resolve as in verifiers). Inject it with
  ``vf.Agent(config, interception=server)``, or serve a whole ``Env`` with ``policy_serving``.
- ``trace_samples``: a finished trace's ``Trace.branches`` as srl ``TrainingSample``s (trainable branches of a
  trainable seat), with the oldest policy version that sampled any of their tokens.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
import uuid
from array import array
from collections.abc import AsyncIterator, Awaitable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol

from verifiers.v1.clients import Client
from verifiers.v1.clients.train import serialize_completion, tool_to_wire
from verifiers.v1.configs.client import BaseClientConfig, TrainClientConfig
from verifiers.v1.dialects import ChatDialect, Dialect
from verifiers.v1.dialects.chat import message_to_wire
from verifiers.v1.errors import ProviderError as VfProviderError
from verifiers.v1.graph import PendingTurn
from verifiers.v1.interception import InterceptionServer
from verifiers.v1.types import AssistantMessage, Response, SamplingConfig, ToolCall, TurnTokens, Usage

from toolkit.errors import SrlRolloutError
from toolkit.models.renderer import parse_tool_calls
from toolkit.run.types import Generation, SamplingParams, TrainingSample

VERSIONS_KEY = "srl_policy_versions"
"""``trace.info`` key of the per-turn policy versions: ``{turn key: {"version": int, "foreign": str | None}}``,
where the turn key is ``sequence_key(prompt_ids + completion_ids)``."""

# The roles a bridged tail may hold: what the environment adds after a sampled assistant turn.
_TAIL_ROLES = frozenset({"tool", "user"})


class PolicyGenerate(Protocol):
    """srl's policy: ``PolicyClient.generate`` or anything with its signature."""

    def __call__(
        self, prompt_ids: list[int], sampling: SamplingParams, *, session_id: str
    ) -> Awaitable[Generation]: ...


class PolicyClientConfig(TrainClientConfig):
    """Selects srl's policy client for an agent seat (``AgentConfig.client`` / ``ModelContext.client``).

    ``policy`` names the policy the interception server was given (one server may hold several). The endpoint
    fields of the base config are unused: the policy client is injected, not built from a URL.
    """

    type: Literal["train"] = "train"
    base_url: str = "srl://policy"
    api_key_var: str = "SRL_POLICY_API_KEY"
    policy: str = "policy"


def sequence_key(token_ids: list[int]) -> str:
    """A short digest of a token sequence (the key of a turn's recorded policy version)."""
    return hashlib.blake2b(array("q", token_ids).tobytes(), digest_size=12).hexdigest()


def _sampling_params(default: SamplingParams, sampling: SamplingConfig, stop_ids: list[int]) -> SamplingParams:
    extra = sampling.model_extra or {}
    params = replace(
        default,
        temperature=default.temperature if sampling.temperature is None else float(sampling.temperature),
        top_p=default.top_p if sampling.top_p is None else float(sampling.top_p),
        max_tokens=default.max_tokens if sampling.max_tokens is None else int(sampling.max_tokens),
        top_k=int(extra["top_k"]) if extra.get("top_k") is not None else default.top_k,
        seed=int(extra["seed"]) if extra.get("seed") is not None else default.seed,
    )
    return replace(params, stop_token_ids=sorted(set(params.stop_token_ids) | set(stop_ids)))


class PolicyModelClient(Client):
    """A verifiers ``Client`` whose model is srl's policy, token-in/token-out.

    ``generate``: the policy (``PolicyClient.generate``; retries, serving gate and policy versions are its own).
    ``renderer``: srl's renderer for the policy's model; it must take ``tools`` and offer ``render_text`` and
    ``continuation`` (``ChatTemplateRenderer`` and ``HermesRenderer`` do). ``sampling``: defaults for the fields
    the rollout's ``SamplingConfig`` leaves unset (``temperature``, ``top_p``, ``max_tokens``, ``top_k``, ``seed``).

    Only the chat-completions dialect is served (a harness speaking Responses or Anthropic messages gets a
    ``ProviderError`` with status 400). A policy failure (an ``SrlRolloutError`` after the policy client's own
    retries) becomes verifiers' ``ProviderError`` with status 400, so the harness SDK does not retry it a second
    time; the interception server records it on the trace.
    """

    def __init__(self, generate: PolicyGenerate, renderer: Any, sampling: SamplingParams | None = None) -> None:
        for attr in ("render", "render_text", "continuation", "decode", "stop_token_ids"):
            if not hasattr(renderer, attr):
                raise TypeError(
                    f"renderer {getattr(renderer, 'name', renderer)!r} lacks {attr!r}; use 'auto' or "
                    f"'hermes' (toolkit.models.renderer)"
                )
        self.generate = generate
        self.renderer = renderer
        self.sampling = sampling or SamplingParams()
        self.bridged_turns = 0
        """Turns whose prompt extended the previous turn's ids (a count, for tests and metrics)."""
        self.rendered_turns = 0
        """Turns whose prompt was rendered whole (first turns and broken prefixes)."""

    def _prompt_ids(
        self, turn: PendingTurn | None, messages: list[dict], tools: list[dict] | None
    ) -> tuple[list[int], bool]:
        """(prompt ids, bridged): the previous turn's ids + the rendered tail when the graph has them."""
        previous = turn.previous_renderer_token_ids() if turn is not None else None
        tail = [message_to_wire(m) for m in turn.tail] if turn is not None else []
        if previous is not None and tail and all(m.get("role") in _TAIL_ROLES for m in tail):
            prev_prompt, prev_completion = previous
            history = messages[: turn.tail_start]
            more = self.renderer.continuation(history, tail, completion_ids=prev_completion, tools=tools)
            if more is not None:
                self.bridged_turns += 1
                return [*prev_prompt, *prev_completion, *more], True
        self.rendered_turns += 1
        return list(self.renderer.render(messages, add_generation_prompt=True, tools=tools)), False

    async def get_response(
        self,
        dialect: Dialect,
        body: dict,
        sampling: SamplingConfig,
        session_id: str | None = None,
        turn: PendingTurn | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Response:
        """One model turn: render, sample from the policy, parse tool calls; returns a ``Response`` with
        ``tokens`` (prompt ids, completion ids, sampling logprobs). Raises verifiers' ``ProviderError``."""
        if not isinstance(dialect, ChatDialect):
            raise VfProviderError(
                f"srl's policy client serves chat completions only, not {type(dialect).__name__}", status_code=400
            )
        if turn is not None:
            prompt, tool_specs = turn.prompt, turn.tools
        else:
            request = dialect.parse_request(body)
            prompt, tool_specs = request.messages, request.tools
        try:
            tools = [tool_to_wire(t) for t in tool_specs] if tool_specs else None
        except NotImplementedError as exc:
            raise VfProviderError(str(exc), status_code=400) from exc
        messages = [message_to_wire(m) for m in prompt]
        try:
            prompt_ids, bridged = self._prompt_ids(turn, messages, tools)
        except Exception as exc:  # a template that cannot render this conversation
            raise VfProviderError(
                f"renderer {self.renderer.name} failed: {type(exc).__name__}: {exc}", status_code=400
            ) from exc
        params = _sampling_params(self.sampling, sampling, self.renderer.stop_token_ids)
        try:
            gen = await self.generate(list(prompt_ids), params, session_id=session_id or uuid.uuid4().hex)
        except SrlRolloutError as exc:
            raise VfProviderError(f"{exc.error_class}: {exc}", status_code=400) from exc
        if len(gen.logprobs) != len(gen.token_ids):
            raise VfProviderError(f"policy returned {len(gen.token_ids)} tokens but {len(gen.logprobs)} logprobs")
        completion_ids = list(gen.token_ids)
        reply_ids = completion_ids
        if gen.finish_reason == "stop" and reply_ids and reply_ids[-1] in params.stop_token_ids:
            reply_ids = reply_ids[:-1]
        content, calls = parse_tool_calls(self.renderer.decode(reply_ids))
        response_id = f"srl-{uuid.uuid4().hex[:16]}"
        tool_calls = [
            ToolCall(id=f"{response_id}-{i}", name=c["name"], arguments=c["arguments"]) for i, c in enumerate(calls)
        ]
        finish = "length" if gen.finish_reason == "length" else ("tool_calls" if tool_calls else "stop")
        model = str(body.get("model") or "policy")
        response = Response(
            id=response_id,
            created=int(time.time()),
            model=model,
            message=AssistantMessage(content=content or None, tool_calls=tool_calls or None),
            finish_reason=finish,
            usage=Usage(prompt_tokens=len(prompt_ids), completion_tokens=len(completion_ids)),
            tokens=TurnTokens(
                prompt_ids=list(prompt_ids),
                completion_ids=completion_ids,
                completion_logprobs=[float(x) for x in gen.logprobs],
                bridged=bridged,
            ),
        )
        response.raw = serialize_completion(response, model)
        if turn is not None:
            _record_version(turn.trace.info, [*prompt_ids, *completion_ids], gen)
        return response


def _record_version(info: dict, sequence: list[int], gen: Generation) -> None:
    book = info.setdefault(VERSIONS_KEY, {})
    key = sequence_key(sequence)
    old = book.get(key)
    # The same token sequence sampled twice: keep the older version (the off-policy bound must not be understated).
    version = gen.policy_version if old is None else min(old["version"], gen.policy_version)
    book[key] = {"version": int(version), "foreign": gen.foreign_version or (old or {}).get("foreign")}


class PolicyInterceptionServer(InterceptionServer):
    """verifiers' interception server, answering ``PolicyClientConfig`` seats with srl's policy clients.

    ``policies`` maps a ``PolicyClientConfig.policy`` name to its client; other client configs (a seat pinned
    to an outside endpoint) resolve as in verifiers. Remaining keyword arguments go to ``InterceptionServer``.
    Raises ``KeyError`` naming the known policies when a seat asks for another one.
    """

    def __init__(self, policies: Mapping[str, PolicyModelClient], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.policies = dict(policies)

    def _client(self, config: BaseClientConfig) -> Client:
        if isinstance(config, PolicyClientConfig):
            if config.policy not in self.policies:
                raise KeyError(f"client.policy {config.policy!r} is not served here; known: {sorted(self.policies)}")
            return self.policies[config.policy]
        return super()._client(config)


@contextlib.asynccontextmanager
async def policy_serving(
    env: Any, policies: Mapping[str, PolicyModelClient]
) -> AsyncIterator[PolicyInterceptionServer]:
    """``env.serving()`` with a ``PolicyInterceptionServer`` as the env's interception: inside it,
    ``env.run_episode(task, ModelContext(model, PolicyClientConfig(), sampling))`` samples from srl's policy.

    verifiers' ``Env.serving`` builds its interception from ``env.config.interception`` and offers no way to
    inject one (``Agent`` does), so this mirrors it (shared tool servers up, interception up, ``env.start()``, and
    the reverse on exit) and sets the env's interception attribute itself. Written against verifiers 0.4.0: it
    uses ``Env._requires_tunnel``, ``Env._shared_tools`` and ``Env._interception``.
    """
    async with env.shared_tools() as shared:
        server = PolicyInterceptionServer(
            policies,
            requires_tunnel=env._requires_tunnel(shared),
            state_service_secrets=tuple(s.state_secret for s in shared.values() if s.state_secret),
        )
        async with server:
            env._shared_tools, env._interception = shared, server
            try:
                await env.start()
                yield server
            finally:
                try:
                    await env.stop()
                finally:
                    env._shared_tools, env._interception = {}, None


@dataclass
class TraceSamples:
    """What a trace gives training: one sample per trainable branch with sampled tokens.

    ``policy_version``: the oldest policy version that sampled any token of ``samples`` (None when there are no
    samples). ``foreign_version``: a version of another run's weights that sampled some of them, if any.
    """

    samples: list[TrainingSample]
    policy_version: int | None
    foreign_version: str | None = None


def trace_samples(trace: Any) -> TraceSamples:
    """``trace.branches`` as ``TrainingSample``s: ``prompt_ids`` are the tokens before the first sampled one,
    the completion everything after, masked True exactly on sampled tokens, with their sampling logprobs.

    A seat the env marked untrainable (``trace.agent.trainable`` False) and branches verifiers marks untrainable
    give nothing. Raises ValueError when a sampled turn has no policy version recorded (it was not sampled by
    ``PolicyModelClient``, e.g. a trainable seat on an outside endpoint).
    """
    if not trace.agent.trainable:
        return TraceSamples([], None)
    book = trace.info.get(VERSIONS_KEY, {})
    samples: list[TrainingSample] = []
    versions: list[int] = []
    foreign: str | None = None
    for branch in trace.branches:
        if not branch.trainable:
            continue
        ids, mask, logprobs = branch.token_ids, branch.sampled_mask, branch.logprobs
        if True not in mask:
            continue
        end = 0
        for node in branch.nodes:
            end += len(node.token_ids)
            if node.sampled and any(node.mask):
                record = book.get(sequence_key(ids[:end]))
                if record is None:
                    raise ValueError(
                        f"trace {trace.id}: a sampled turn ending at token {end} has no srl policy "
                        "version (not sampled through PolicyModelClient)"
                    )
                versions.append(int(record["version"]))
                foreign = foreign or record.get("foreign")
        start = mask.index(True)
        samples.append(
            TrainingSample(
                prompt_ids=list(ids[:start]),
                completion_ids=list(ids[start:]),
                completion_mask=list(mask[start:]),
                completion_logprobs=[float(x) for x in logprobs[start:]],
            )
        )
    return TraceSamples(samples, min(versions) if versions else None, foreign)
