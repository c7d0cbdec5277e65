"""The orchestrator's per-group render cache and the env worker's per-task trace identity give the same results as
the uncached paths (a real tokenizer and chat template; a real taskset)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from prereqs import need_module

need_module("transformers")
need_module("verifiers.v1")

from toolkit.models.renderer import CachedRenderer, ChatTemplateRenderer, PlainRenderer


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    from toolkit.models.tiny import build_tiny_model

    path = build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)
    return AutoTokenizer.from_pretrained(str(path))


class CountingRenderer(ChatTemplateRenderer):
    """The real chat template renderer, counting the template applications."""

    calls = 0

    def render(self, messages, *, add_generation_prompt=True):
        self.calls += 1
        return super().render(messages, add_generation_prompt=add_generation_prompt)


CHATS = [
    [{"role": "user", "content": "abc"}],
    [{"role": "system", "content": "be brief"}, {"role": "user", "content": "abc"}],
    [{"role": "user", "content": "abc"}, {"role": "assistant", "content": "cba"}, {"role": "user", "content": "x"}],
    [{"role": "user", "content": "abd"}],
]


def test_cached_renders_equal_uncached(tokenizer):
    inner = CountingRenderer(tokenizer=tokenizer)
    cached = CachedRenderer(inner)
    plain = ChatTemplateRenderer(tokenizer=tokenizer)
    for _ in range(3):
        for chat in CHATS:
            for gen in (True, False):
                assert cached.render(chat, add_generation_prompt=gen) == plain.render(chat, add_generation_prompt=gen)
    assert inner.calls == 2 * len(CHATS)  # one application per distinct (conversation, generation prompt)
    assert cached.name == plain.name and cached.stop_token_ids == plain.stop_token_ids
    assert cached.decode([6 + ord("a") - 32]) == plain.decode([6 + ord("a") - 32])
    assert cached.tokenizer is tokenizer  # other attributes are the wrapped renderer's


def test_cached_render_returns_a_fresh_list(tokenizer):
    cached = CachedRenderer(PlainRenderer(tokenizer=tokenizer))
    first = cached.render(CHATS[0])
    first.extend([1, 2, 3])  # the rollout extends its sample's ids
    assert cached.render(CHATS[0]) == PlainRenderer(tokenizer=tokenizer).render(CHATS[0])


def test_cache_is_bounded_and_skips_non_plain_messages(tokenizer):
    inner = CountingRenderer(tokenizer=tokenizer)
    cached = CachedRenderer(inner, maxsize=2)
    for chat in CHATS[:3]:
        cached.render(chat)
    assert cached._cached.cache_info().currsize == 2
    cached.render(CHATS[0])  # evicted (least recently used): rendered again
    assert inner.calls == 4
    odd = [{"role": "user", "content": "abc", "name": "bob"}]  # a field the key would not hold
    cached.render(odd)
    cached.render(odd)
    assert inner.calls == 6


def test_episode_identity_matches_the_task():
    from toolkit.envs.episode import Episode
    from toolkit.envs.registry import load_tasks

    tasks = load_tasks(SimpleNamespace(id="srl-reverse-text", split="train", seed=0, select=None, model_extra={}))
    for task in tasks[:3]:
        for _ in range(2):  # the second episode of a task uses the cached identity
            ep = Episode(task)
            assert (ep.trace.task.key, ep.trace.task.hash) == (task.key, task.hash)
            assert ep.trace.agent.config == type(ep.trace.agent.config)(runtime=ep.runtime_config)
    a, b = Episode(tasks[0]), Episode(tasks[0])
    assert a.trace.agent.config is not b.trace.agent.config and a.trace.id != b.trace.id
    messages = asyncio.run(a.start())
    asyncio.run(a.close())
    assert messages[-1]["content"].endswith(tasks[0].data.text)
