"""``alphabet-sort``: a multi-turn taskset. Sort names alphabetically, then merge in more names each turn.

Turn 1 gives ``names_per_turn`` names; each later turn (up to ``num_turns``) adds more and asks for the full
sorted list again. The plain chat harness asks the task for the next user message after every assistant reply
through ``user_turn(trace)`` (srl's multi-turn hook; None ends the episode).

Reward ``turn_score``: the mean over all ``num_turns`` turns of the list similarity between the reply's lines
and the expected sorted list, ``lcs_ratio(expected_lines, reply_lines)`` (1.0 for the exact list, turns never
reached count 0). Metric ``final_exact``: 1.0 iff the last expected turn was answered exactly.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import verifiers.v1 as vf

from toolkit.envs.tasksets.common import SplitTasksetConfig, generate_split, lcs_ratio

NAMES = [
    "Ada",
    "Alan",
    "Alice",
    "Amir",
    "Anna",
    "Aria",
    "Ben",
    "Bruno",
    "Carla",
    "Chen",
    "Clara",
    "Dara",
    "Diego",
    "Eli",
    "Emma",
    "Erik",
    "Eva",
    "Farah",
    "Felix",
    "Gus",
    "Hana",
    "Hugo",
    "Ida",
    "Igor",
    "Ines",
    "Ivan",
    "Jack",
    "Jade",
    "Jonas",
    "Kai",
    "Kara",
    "Leo",
    "Lina",
    "Luca",
    "Maya",
    "Mila",
    "Nina",
    "Noah",
    "Nora",
    "Omar",
    "Otto",
    "Paul",
    "Pia",
    "Quinn",
    "Rafa",
    "Rosa",
    "Ruth",
    "Sami",
    "Sara",
    "Theo",
    "Tina",
    "Uma",
    "Vera",
    "Viktor",
    "Wes",
    "Xena",
    "Yara",
    "Yuki",
    "Zane",
    "Zoe",
]

FIRST = "Sort these names alphabetically. Reply with one name per line and nothing else.\n{names}"
LATER = "Add these names and reply with the whole list sorted alphabetically, one name per line.\n{names}"


class AlphabetSortConfig(SplitTasksetConfig):
    num_turns: int = 2
    names_per_turn: int = 3


class AlphabetSortData(vf.TaskData):
    turns: list[list[str]]
    """The names introduced at each turn; turn j expects ``sorted(turns[0] + ... + turns[j])``."""


def expected_lists(turns: list[list[str]]) -> list[list[str]]:
    """The sorted list expected after each turn."""
    return [sorted(names) for names in itertools.accumulate(turns)]  # list + list: the names so far


def reply_lines(text: str) -> list[str]:
    """Non-empty stripped lines of a reply."""
    return [line.strip() for line in text.splitlines() if line.strip()]


class AlphabetSortTask(vf.Task[AlphabetSortData, vf.State, vf.TaskConfig]):
    async def user_turn(self, trace: vf.Trace) -> str | None:
        """The next user message after the assistant's latest reply, or None when all turns are done."""
        done = len(trace.assistant_messages)
        if done >= len(self.data.turns):
            return None
        return LATER.format(names="\n".join(self.data.turns[done]))

    @vf.reward(weight=1.0)
    async def turn_score(self, task: AlphabetSortData, trace: vf.Trace) -> float:
        replies = [m.content or "" for m in trace.assistant_messages]
        expected = expected_lists(task.turns)
        scores = [lcs_ratio(exp, reply_lines(r)) for exp, r in zip(expected, replies)]
        return sum(scores) / len(expected)

    @vf.metric
    async def final_exact(self, task: AlphabetSortData, trace: vf.Trace) -> float:
        replies = trace.assistant_messages
        if len(replies) < len(task.turns):
            return 0.0
        return float(reply_lines(replies[len(task.turns) - 1].content or "") == expected_lists(task.turns)[-1])


class AlphabetSortTaskset(vf.Taskset[AlphabetSortTask, AlphabetSortConfig]):
    def load(self) -> Iterator[AlphabetSortTask]:
        cfg = self.config
        total = cfg.num_turns * cfg.names_per_turn
        if cfg.num_turns < 1 or cfg.names_per_turn < 1 or total > len(NAMES):
            raise ValueError(f"need num_turns, names_per_turn >= 1 and their product <= {len(NAMES)}")

        def make(rng) -> list[list[str]]:
            names = rng.sample(NAMES, total)
            return [names[i : i + cfg.names_per_turn] for i in range(0, total, cfg.names_per_turn)]

        items = generate_split(cfg, make, key=lambda turns: "|".join(",".join(t) for t in turns))
        return (
            AlphabetSortTask(
                AlphabetSortData(
                    id=f"alphabet-sort/{cfg.split}/{i}",
                    prompt=FIRST.format(names="\n".join(turns[0])),
                    turns=turns,
                ),
                cfg.task,
            )
            for i, turns in enumerate(items)
        )


__all__ = ["AlphabetSortTaskset"]
