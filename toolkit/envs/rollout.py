"""One rollout, token-in/token-out: render the chat to ids, sample ids from the policy, let the env answer.

The policy is any object with ``async generate(prompt_ids, sampling, *, session_id) -> Generation`` (srl's
``PolicyClient``); the environment half is an ``EnvSession`` (an env worker's episode, or an in-process one).

Exact-prefix rule: a turn's prompt ids must start with the previous turn's prompt + completion ids exactly.
Then the new tokens in between (template scaffold, the env's user message) are appended to the current
``TrainingSample`` with mask False, and the new completion with mask True. When the prefix breaks (a chat
template that rewrites history, a completion that does not re-tokenise to itself) the trajectory continues in a
new ``TrainingSample`` that starts from the full new prompt; samples are never stitched.

Truncation reasons: ``max_tokens`` (the last turn hit its token limit; earlier turns cut this way still get the
env's answer and the episode goes on), ``max_turns`` (the task wanted another turn), ``max_total_tokens`` (prompt
+ completion would exceed the per-rollout budget; a turn's ``max_tokens`` is clipped to what is left, and the
episode ends when a clipped turn runs out or nothing is left).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any, Protocol

from toolkit.errors import HarnessError, ProviderError
from toolkit.models.renderer import Renderer
from toolkit.run.types import Generation, Rollout, SamplingParams, TrainingSample


class PolicyLike(Protocol):
    async def generate(self, prompt_ids: list[int], sampling: SamplingParams, *, session_id: str) -> Generation: ...


class EnvSession(Protocol):
    """The environment half of one rollout. Every method raises an ``SrlRolloutError`` subclass on failure."""

    async def start(self) -> tuple[str, list[dict[str, str]]]:
        """Run setup; return (task id, first messages)."""
        ...

    async def step(self, reply: str) -> tuple[list[dict[str, str]], bool]:
        """Give the policy's reply; return (new messages, done)."""
        ...

    async def finish(self) -> dict[str, Any]:
        """Finalize and score: ``{"reward", "components", "metrics", "wants_more"}``."""
        ...

    async def close(self) -> None:
        """Release the episode (idempotent, never raises)."""
        ...


@dataclasses.dataclass
class RolloutLimits:
    """Per-rollout limits: ``max_turns`` assistant turns, ``max_total_tokens`` prompt + completion tokens."""

    max_turns: int | None = None
    max_total_tokens: int | None = None


def _strip_stop(token_ids: list[int], stop_ids: list[int], finish_reason: str) -> list[int]:
    """The completion without its final stop token (the env reads the reply, not the end-of-turn marker)."""
    if finish_reason == "stop" and token_ids and token_ids[-1] in stop_ids:
        return token_ids[:-1]
    return token_ids


async def run_rollout(
    session: EnvSession,
    *,
    client: PolicyLike,
    renderer: Renderer,
    sampling: SamplingParams,
    env_name: str,
    example_id: int,
    session_id: str,
    limits: RolloutLimits | None = None,
) -> Rollout:
    """Run one episode to the end and score it. Returns a valid Rollout, or raises an ``SrlRolloutError``.

    Never catches policy or env errors: the caller (``EnvRuntime.run_group``) owns retries and error records.
    Timings (seconds): ``setup``, ``generation`` (sum over turns), ``env`` (sum of env steps), ``scoring``.
    """
    limits = limits or RolloutLimits()
    stop_ids = sorted(set(sampling.stop_token_ids) | set(renderer.stop_token_ids))
    timings = {"setup": 0.0, "generation": 0.0, "env": 0.0, "scoring": 0.0}
    t0 = time.perf_counter()
    task_id, messages = await session.start()
    timings["setup"] = time.perf_counter() - t0

    samples: list[TrainingSample] = []
    current: TrainingSample | None = None
    previous: list[int] | None = None  # previous prompt + completion ids
    versions: list[int] = []
    foreign: str | None = None  # the first version of another run's weights an engine reported
    turns = 0
    truncated_reason: str | None = None
    while True:
        try:
            prompt_ids = renderer.render(messages, add_generation_prompt=True)
        except Exception as exc:  # a template that cannot render this conversation
            raise HarnessError(f"renderer {renderer.name} failed: {type(exc).__name__}: {exc}") from exc
        if current is not None and previous is not None and prompt_ids[: len(previous)] == previous:
            bridge = prompt_ids[len(previous) :]
            current.completion_ids.extend(bridge)
            current.completion_mask.extend([False] * len(bridge))
            current.completion_logprobs.extend([0.0] * len(bridge))
        else:
            current = TrainingSample(list(prompt_ids), [], [], [])
            samples.append(current)

        max_tokens = sampling.max_tokens
        if limits.max_total_tokens is not None:
            left = limits.max_total_tokens - len(prompt_ids)
            if left <= 0:
                truncated_reason = "max_total_tokens"
                if not current.completion_ids:
                    samples.pop()  # nothing was sampled from this prompt
                break
            max_tokens = min(max_tokens, left)
        turn_sampling = dataclasses.replace(sampling, max_tokens=max_tokens, stop_token_ids=stop_ids)

        t = time.perf_counter()
        gen = await client.generate(list(prompt_ids), turn_sampling, session_id=session_id)
        timings["generation"] += time.perf_counter() - t
        if len(gen.logprobs) != len(gen.token_ids):
            raise ProviderError(f"policy returned {len(gen.token_ids)} tokens but {len(gen.logprobs)} logprobs")
        versions.append(gen.policy_version)
        foreign = foreign or gen.foreign_version
        current.completion_ids.extend(gen.token_ids)
        current.completion_mask.extend([True] * len(gen.token_ids))
        current.completion_logprobs.extend(float(x) for x in gen.logprobs)
        previous = list(prompt_ids) + list(gen.token_ids)
        turns += 1

        reply = renderer.decode(_strip_stop(list(gen.token_ids), stop_ids, gen.finish_reason))
        t = time.perf_counter()
        new_messages, done = await session.step(reply)
        timings["env"] += time.perf_counter() - t
        messages = messages + [{"role": "assistant", "content": reply}] + list(new_messages)
        # A turn cut by its own token limit is an incomplete reply, not the end of the episode: the env answers
        # it like any other (as verifiers' harness does). Cut by the rollout's total budget, nothing is left.
        truncated_reason = None
        if gen.finish_reason == "length":
            truncated_reason = "max_tokens" if max_tokens == sampling.max_tokens else "max_total_tokens"
        if done or truncated_reason == "max_total_tokens":
            break
        if limits.max_turns is not None and turns >= limits.max_turns:
            truncated_reason = "max_turns"
            break

    t = time.perf_counter()
    scored = await session.finish()
    timings["scoring"] = time.perf_counter() - t
    if truncated_reason is None and scored.get("wants_more"):
        truncated_reason = "max_turns"
    timings["total"] = time.perf_counter() - t0
    return Rollout(
        env=env_name,
        task_id=task_id,
        example_id=example_id,
        samples=samples,
        reward=float(scored["reward"]),
        reward_components=dict(scored.get("components", {})),
        metrics=dict(scored.get("metrics", {})),
        num_turns=turns,
        truncated=truncated_reason is not None,
        truncation_reason=truncated_reason,
        policy_version=min(versions) if versions else 0,
        foreign_version=foreign,
        timings=timings,
    )


async def wait_excluding_outage(aw: Any, timeout_s: float | None, client: Any) -> Any:
    """Await ``aw`` for at most ``timeout_s`` seconds, not counting time the policy client's serving gate was
    closed (growth of ``client.outage_seconds()``, while an engine restarts): a rollout timeout bounds the harness,
    not an inference outage. A client without a gate gives a plain ``asyncio.wait_for``. Raises
    asyncio.TimeoutError (``aw`` cancelled) when the time is up."""
    outage = getattr(client, "outage_seconds", None)
    if timeout_s is None or outage is None:
        return await asyncio.wait_for(aw, timeout_s)
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(aw)
    t0, held0 = loop.time(), outage()
    try:
        while True:
            left = timeout_s - (loop.time() - t0 - (outage() - held0))
            if left <= 0:
                break
            done, _ = await asyncio.wait({task}, timeout=left)
            if done:
                return task.result()
    except BaseException:
        task.cancel()
        raise
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    raise TimeoutError
