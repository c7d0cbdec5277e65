"""``srl-code-lookup``: answer with the code filed under a key, which only a tool knows (a tool-use task).

Each task names a random lowercase key (``key_length`` letters); the reply must be the key's code, a string of
``code_length`` digits drawn from a stream private to ``(seed, key)``, so no prompt, key or other task reveals
it: the policy has to call the taskset's tool, ``vault_lookup(key)``, and answer with what it returns. The tool
server (a ``vf.Toolset``, one per env worker, shared by its rollouts: verifiers' taskset scope) answers any key
with its code. Train and test keys are disjoint, so a held-out eval measures tool use, not memorised codes.

Rewards and metrics: ``correct`` (reward, weight 1) is 1.0 when the reply, stripped, is the code; ``lookup_calls``
counts the tool results in the episode; ``looked_up_key`` is 1.0 when one of them is the task's code (the policy
asked for the right key).

Every task carries ``reference_messages``, the known-good episode after the prompt (the tool call, its result, the
answer), which ``srl sft make-data`` writes as an SFT conversation with the tool's schema.

Run as a module (``python -m toolkit.envs.tasksets.code_lookup``) it serves the tool, as verifiers launches it.
"""

from __future__ import annotations

import json
import random
import string
from collections.abc import Iterator

import verifiers.v1 as vf

from toolkit.envs.tasksets.common import SplitTasksetConfig, generate_split

SYSTEM_PROMPT = "Use the tools. Reply with the code alone."
PROMPT = "Code for {key}?"


def code_for(seed: int, key: str, length: int) -> str:
    """The code filed under ``key``: ``length`` decimal digits from a ``random.Random`` seeded with the taskset's
    seed and the key (string seeding is stable across processes), so the tool and the tasks agree."""
    rng = random.Random(f"srl-code-lookup:{seed}:{key}")
    return "".join(rng.choice(string.digits) for _ in range(length))


class VaultConfig(vf.SharedToolsetConfig):
    """The tool server's config; the taskset fills in its own ``seed`` and ``code_length``."""

    seed: int = 0
    code_length: int = 4


class VaultToolset(vf.Toolset[VaultConfig]):
    TOOL_PREFIX = "vault"

    @vf.tool
    def lookup(self, key: str) -> str:
        """The code filed under key."""
        key = key.strip().lower()
        if not key or not key.isalpha() or not key.isascii():
            return "unknown key"
        return code_for(self.config.seed, key, self.config.code_length)


class CodeLookupConfig(SplitTasksetConfig):
    key_length: int = 5
    code_length: int = 4
    prompt: str = PROMPT
    """User prompt with a ``{key}`` field."""
    instructions: str = SYSTEM_PROMPT
    """The tasks' system prompt (the renderer appends the tool schema to it)."""
    tools: VaultConfig = VaultConfig()


class CodeLookupData(vf.TaskData):
    key: str
    answer: str
    reference_messages: list[dict]


class CodeLookupTask(vf.Task[CodeLookupData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=1.0)
    async def correct(self, task: CodeLookupData, trace: vf.Trace) -> float:
        return float(trace.last_reply == task.answer)

    @vf.metric
    async def lookup_calls(self, task: CodeLookupData, trace: vf.Trace) -> float:
        return float(len(trace.tool_messages))

    @vf.metric
    async def looked_up_key(self, task: CodeLookupData, trace: vf.Trace) -> float:
        return float(any(_text(m.content).strip() == task.answer for m in trace.tool_messages))


def _text(content: object) -> str:
    if isinstance(content, list):
        return "".join(p.get("text", "") if isinstance(p, dict) else getattr(p, "text", "") for p in content)
    return str(content or "")


def reference_messages(key: str, code: str) -> list[dict]:
    """The known-good episode after the prompt, as OpenAI chat messages: the tool call, its result, the answer."""
    call = {
        "id": "call_0",
        "type": "function",
        "function": {"name": "vault_lookup", "arguments": json.dumps({"key": key})},
    }
    return [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_0", "content": code},
        {"role": "assistant", "content": code},
    ]


class CodeLookupTaskset(vf.Taskset[CodeLookupTask, CodeLookupConfig]):
    @classmethod
    def toolsets(cls, config: CodeLookupConfig) -> list[vf.Toolset]:
        tools = config.tools.model_copy(update={"seed": config.seed, "code_length": config.code_length})
        return [VaultToolset(tools)]

    def load(self) -> Iterator[CodeLookupTask]:
        cfg = self.config
        if not 1 <= cfg.key_length <= 32 or not 1 <= cfg.code_length <= 32:
            raise ValueError(f"key_length and code_length must be 1 to 32, got {cfg.key_length}, {cfg.code_length}")
        if "{key}" not in cfg.prompt:
            raise ValueError("code-lookup prompt must contain the {key} field")

        def make(rng: random.Random) -> str:
            return "".join(rng.choice(string.ascii_lowercase) for _ in range(cfg.key_length))

        for i, key in enumerate(generate_split(cfg, make, key=lambda k: k)):
            code = code_for(cfg.seed, key, cfg.code_length)
            yield CodeLookupTask(
                CodeLookupData(
                    id=f"code-lookup/{cfg.split}/{i}",
                    system_prompt=cfg.instructions,
                    prompt=cfg.prompt.replace("{key}", key),
                    key=key,
                    answer=code,
                    reference_messages=reference_messages(key, code),
                ),
                cfg.task,
            )


if __name__ == "__main__":
    VaultToolset.run()

__all__ = ["CodeLookupTaskset"]
