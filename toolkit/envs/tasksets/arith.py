"""``arith``: integer arithmetic questions; reward 1.0 iff the last number in the reply equals the answer.

Each task is ``a op b`` with ``op`` in ``ops`` and operands in ``[0, max_operand]``. The reward ``exact_match``
parses the last number written in the reply (``common.last_number``) and compares it numerically with the answer:
"12", "= 12" and "12.0" all score 1.0; an empty or number-free reply scores 0.0.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator

import verifiers.v1 as vf
from pydantic import Field

from toolkit.envs.tasksets.common import SplitTasksetConfig, generate_split, last_number

PROMPT = "Compute {a} {op} {b}. Reply with the number only."
_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}


class ArithConfig(SplitTasksetConfig):
    max_operand: int = 99
    ops: list[str] = Field(default_factory=lambda: ["+", "-", "*"])


class ArithData(vf.TaskData):
    expression: str
    answer: int


class ArithTask(vf.Task[ArithData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=1.0)
    async def exact_match(self, task: ArithData, trace: vf.Trace) -> float:
        value = last_number(trace.last_reply)
        return float(value is not None and value == task.answer)


class ArithTaskset(vf.Taskset[ArithTask, ArithConfig]):
    def load(self) -> Iterator[ArithTask]:
        cfg = self.config
        unknown = set(cfg.ops) - set(_OPS)
        if unknown or not cfg.ops:
            raise ValueError(f"ops must be a non-empty subset of {sorted(_OPS)}, got {cfg.ops}")

        def make(rng) -> tuple[int, str, int]:
            return rng.randint(0, cfg.max_operand), rng.choice(cfg.ops), rng.randint(0, cfg.max_operand)

        items = generate_split(cfg, make, key=lambda t: f"{t[0]}{t[1]}{t[2]}")
        return (
            ArithTask(
                ArithData(
                    id=f"arith/{cfg.split}/{i}",
                    prompt=PROMPT.format(a=a, op=op, b=b),
                    expression=f"{a} {op} {b}",
                    answer=_OPS[op](a, b),
                ),
                cfg.task,
            )
            for i, (a, op, b) in enumerate(items)
        )


__all__ = ["ArithTaskset"]
