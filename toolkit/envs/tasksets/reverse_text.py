"""``reverse-text``: reverse a random lowercase string; reward = LCS ratio to the reversed string.

Tasks are random lowercase strings of ``min_length``..``max_length`` characters (3-8 by default). The reward
``lcs_reward`` is ``lcs_ratio(reversed(text), reply.strip())`` (see ``common.lcs_ratio``): 1.0 for the exact
reversal, 0.0 for an empty reply. Whatever the policy emits (special tokens included) is part of the reply, so
filler tokens lower the reward instead of hiding from it.
"""

from __future__ import annotations

import string
from collections.abc import Iterator

import verifiers.v1 as vf

from toolkit.envs.tasksets.common import SplitTasksetConfig, generate_split, lcs_ratio

PROMPT = "Reverse the text character by character. Reply with the reversed text only.\nText: {text}"


class ReverseTextConfig(SplitTasksetConfig):
    min_length: int = 3
    max_length: int = 8
    prompt: str = PROMPT
    """Prompt template with a ``{text}`` field. Tiny char-level models train faster on a short one (each prompt
    character is a token the trainer runs on)."""
    prompt_padding: int = 0
    """Pad the prompt with this many spaces before the text (long prompts that span whole KV blocks, P/D tests)."""


class ReverseTextData(vf.TaskData):
    text: str
    answer: str


class ReverseTextTask(vf.Task[ReverseTextData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=1.0)
    async def lcs_reward(self, task: ReverseTextData, trace: vf.Trace) -> float:
        return lcs_ratio(task.answer, trace.last_reply)

    @vf.metric
    async def exact(self, task: ReverseTextData, trace: vf.Trace) -> float:
        return float(trace.last_reply == task.answer)


class ReverseTextTaskset(vf.Taskset[ReverseTextTask, ReverseTextConfig]):
    def load(self) -> Iterator[ReverseTextTask]:
        cfg = self.config
        if not 1 <= cfg.min_length <= cfg.max_length:
            raise ValueError(f"need 1 <= min_length <= max_length, got {cfg.min_length}, {cfg.max_length}")

        def make(rng) -> str:
            n = rng.randint(cfg.min_length, cfg.max_length)
            return "".join(rng.choice(string.ascii_lowercase) for _ in range(n))

        if "{text}" not in cfg.prompt:
            raise ValueError("reverse-text prompt must contain the {text} field")
        return (
            ReverseTextTask(
                ReverseTextData(
                    id=f"reverse-text/{cfg.split}/{i}",
                    prompt=" " * cfg.prompt_padding + cfg.prompt.replace("{text}", text),
                    text=text,
                    answer=text[::-1],
                ),
                cfg.task,
            )
            for i, text in enumerate(generate_split(cfg, make, key=lambda t: t))
        )


__all__ = ["ReverseTextTaskset"]
