"""What `srl sft make-data` writes for a tool taskset is what the policy sees in a live episode: the row's prompt,
rendered with the row's tool schemas as the SFT trainer renders it, is token for token the prompt of the episode's
first model call through verifiers' rollout (its chat program, the taskset's tool server over MCP), and the row's
known-good episode replayed as the model's replies earns the full reward.

Why a test: a small model trained on one form of the prompt garbles its calls on another. The schema's key order
differed between the MCP server's registration (the rows) and the MCP client's copy (live), and a model with a
perfect held-out call on the rows' form wrote ``vault_lokup`` with a wrong key on the live one.
"""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from tests.vf_differential import ScriptedPolicy, run_env_srl, tool_call_text

pytestmark = pytest.mark.timeout(300)


def test_a_code_lookup_row_renders_to_the_live_episodes_prompt_and_earns_the_reward():
    from toolkit.envs.reference import reference_rows
    from toolkit.models import resolve_model
    from toolkit.models.renderer import HermesRenderer

    fields = {"split": "train", "seed": 0, "num_train_examples": 2}
    rows = reference_rows(SimpleNamespace(id="srl-code-lookup", select=None, model_extra=fields, **fields))
    renderer = HermesRenderer(resolve_model("tiny-qwen3"))

    def known_good(conversation) -> str:
        """The row's own assistant turns, in order: the tool call, then the answer."""
        row = next(r for r in rows if r["prompt"][-1]["content"] == next(t for ro, t in conversation if ro == "user"))
        call, _result, answer = row["completion"]
        if not any(role == "tool" for role, _ in conversation):
            function = call["tool_calls"][0]["function"]
            return tool_call_text(function["name"], json.loads(function["arguments"]))
        return answer["content"]

    policy = ScriptedPolicy(renderer, known_good)
    episodes = asyncio.run(
        run_env_srl(policy, "srl-code-lookup", {"num_train_examples": 2}, "default", 3, [0, 1], max_tokens=128)
    )
    firsts = list({t.session_id: t for t in reversed(policy.turns)}.values())[::-1]  # episodes ran one by one
    assert len(firsts) == len(rows) and len(policy.turns) == 2 * len(rows)  # a call and an answer each
    for row, episode, first in zip(rows, episodes, firsts, strict=True):
        assert episode.error is None, episode.error
        sft_prompt = list(renderer.render(row["prompt"], add_generation_prompt=True, tools=row["tools"]))
        assert first.prompt_ids == sft_prompt, (renderer.decode(first.prompt_ids), renderer.decode(sft_prompt))
        (trace,) = episode.result["traces"]
        assert trace["reward"] == 1.0 and trace["metrics"]["looked_up_key"] == 1.0, trace
