"""Token-in/token-out rollout: exact-prefix extension, splitting on a history-rewriting template, truncation.

The policy here is a scripted stand-in (it returns the token ids of given replies with fixed logprobs), the one
part that cannot be real in a fast test; the renderer (a real transformers tokenizer and chat template), the
taskset and the plain chat harness are the real ones. tests/integration/test_envs_vllm.py uses real vLLM.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from prereqs import need_module

need_module("verifiers.v1")
need_module("transformers")

from local_session import LocalSession

from toolkit.envs.registry import load_tasks
from toolkit.envs.rollout import RolloutLimits, run_rollout
from toolkit.envs.tasksets.alphabet_sort import expected_lists
from toolkit.models.renderer import ChatTemplateRenderer
from toolkit.run.types import Generation, SamplingParams

# A Qwen3-style template: earlier assistant turns lose their "<think>...</think>" part, i.e. the template
# rewrites history, so a reasoning turn's tokens are not a prefix of the next prompt.
REWRITING_TEMPLATE = (
    "{%- set ns = namespace(last_user=0) -%}"
    "{%- for m in messages -%}{%- if m['role'] == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- for m in messages -%}"
    "{%- set c = m['content'] -%}"
    "{%- if m['role'] == 'assistant' and loop.index0 < ns.last_user -%}{%- set c = c.split('</think>')[-1] -%}"
    "{%- endif -%}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + c + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    from toolkit.models.tiny import build_tiny_model

    path = build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)
    return AutoTokenizer.from_pretrained(str(path))


class ScriptedPolicy:
    """Returns the encoded replies in order (+ eos when ``stop``), logprob -0.5 per token; records prompts."""

    def __init__(self, tokenizer, replies: list[str], finish: str = "stop") -> None:
        self.tok, self.replies, self.finish, self.prompts = tokenizer, list(replies), finish, []

    async def generate(self, prompt_ids, sampling, *, session_id):
        self.prompts.append(list(prompt_ids))
        ids = self.tok.encode(self.replies.pop(0), add_special_tokens=False)[: sampling.max_tokens]
        if self.finish == "stop" and len(ids) < sampling.max_tokens:
            ids.append(self.tok.eos_token_id)
            finish = "stop"
        else:
            finish = "length"
        return Generation(token_ids=ids, logprobs=[-0.5] * len(ids), finish_reason=finish, policy_version=3)


def alphabet_task(num_turns: int = 2):
    ns = SimpleNamespace(
        id="srl-alphabet-sort",
        split="train",
        seed=0,
        select=None,
        model_extra={"num_turns": num_turns, "names_per_turn": 2, "num_train_examples": 3},
    )
    return load_tasks(ns)[0]


def rollout(task, renderer, policy, limits=None, max_tokens=64):
    return asyncio.run(
        run_rollout(
            LocalSession(task, max_turns=limits.max_turns if limits else None),
            client=policy,
            renderer=renderer,
            sampling=SamplingParams(max_tokens=max_tokens),
            env_name="t",
            example_id=0,
            session_id="s",
            limits=limits,
        )
    )


def check_sample_consistency(r, policy):
    for s in r.samples:
        assert len(s.completion_ids) == len(s.completion_mask) == len(s.completion_logprobs)
        assert all(lp == -0.5 for lp, m in zip(s.completion_logprobs, s.completion_mask) if m)
        assert all(lp == 0.0 for lp, m in zip(s.completion_logprobs, s.completion_mask) if not m)
    # Each prompt the policy saw is the start of exactly one sample's full sequence.
    for p in policy.prompts:
        assert any((s.prompt_ids + s.completion_ids)[: len(p)] == p for s in r.samples)


def test_append_only_template_gives_one_sample(tokenizer):
    renderer = ChatTemplateRenderer(tokenizer=tokenizer)
    task = alphabet_task()
    replies = ["\n".join(e) for e in expected_lists(task.data.turns)]
    policy = ScriptedPolicy(tokenizer, replies)
    r = rollout(task, renderer, policy)
    assert r.reward == 1.0 and r.num_turns == 2 and not r.truncated and r.policy_version == 3
    assert len(r.samples) == 1
    s = r.samples[0]
    assert s.prompt_ids == policy.prompts[0]
    assert s.prompt_ids + s.completion_ids[: len(policy.prompts[1]) - len(s.prompt_ids)] == policy.prompts[1]
    # Sampled tokens: both replies plus their eos tokens.
    assert sum(s.completion_mask) == sum(len(tokenizer.encode(x, add_special_tokens=False)) + 1 for x in replies)
    check_sample_consistency(r, policy)


def test_history_rewriting_template_splits_not_stitches(tokenizer):
    original = tokenizer.chat_template
    tokenizer.chat_template = REWRITING_TEMPLATE
    try:
        renderer = ChatTemplateRenderer(tokenizer=tokenizer)
        task = alphabet_task(num_turns=3)
        expected = expected_lists(task.data.turns)
        replies = [f"<think>sorting</think>{chr(10).join(e)}" for e in expected]
        policy = ScriptedPolicy(tokenizer, replies)
        r = rollout(task, renderer, policy)
    finally:
        tokenizer.chat_template = original
    assert r.num_turns == 3
    assert len(r.samples) == 3  # every later turn's prompt dropped the earlier reasoning
    for s, p in zip(r.samples, policy.prompts):
        assert s.prompt_ids == p
        assert all(s.completion_mask)  # no env tokens were stitched onto a broken prefix
    check_sample_consistency(r, policy)


def test_truncation_reasons(tokenizer):
    renderer = ChatTemplateRenderer(tokenizer=tokenizer)
    task = alphabet_task(num_turns=3)
    expected = ["\n".join(e) for e in expected_lists(task.data.turns)]

    r = rollout(task, renderer, ScriptedPolicy(tokenizer, expected, finish="length"), max_tokens=4)
    # Every turn is cut at 4 tokens; the env still answers each, so all 3 turns run and the last one counts.
    assert r.truncated and r.truncation_reason == "max_tokens" and r.num_turns == 3
    assert 0.0 <= r.reward < 1.0

    r = rollout(task, renderer, ScriptedPolicy(tokenizer, expected), limits=RolloutLimits(max_turns=2))
    assert r.truncated and r.truncation_reason == "max_turns" and r.num_turns == 2

    first_prompt = len(renderer.render([{"role": "user", "content": task.data.prompt}]))
    limits = RolloutLimits(max_total_tokens=first_prompt + 5)
    policy = ScriptedPolicy(tokenizer, expected)
    r = rollout(task, renderer, policy, limits=limits)
    assert r.truncated and r.truncation_reason == "max_total_tokens"
    assert sum(len(s.prompt_ids) + len(s.completion_ids) for s in r.samples) <= first_prompt + 5
