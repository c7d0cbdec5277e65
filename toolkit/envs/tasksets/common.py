"""Shared pieces of srl's built-in verifiers v1 tasksets: split/seed config, deterministic generation, text scores.

Every built-in taskset generates its tasks from ``(seed, split)`` with its own ``random.Random`` stream, so the
same config always yields the same tasks in the same order, in any process. Train and test are disjoint: the
test split is generated first and the train stream skips any task whose key (its answer or prompt) is in it.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from typing import Literal, TypeVar

import verifiers.v1 as vf

Split = Literal["train", "test"]
T = TypeVar("T")


class SplitTasksetConfig(vf.TasksetConfig):
    """Config fields shared by srl's built-in tasksets (``taskset = {id, split, seed, ...}`` in the TOML).

    ``num_train_examples``/``num_test_examples`` are task counts of the two splits.
    """

    split: Split = "train"
    seed: int = 0
    num_train_examples: int = 1000
    num_test_examples: int = 100


def split_rng(seed: int, split: str) -> random.Random:
    """A ``random.Random`` private to one (seed, split) stream; string seeding is stable across processes."""
    return random.Random(f"srl-taskset:{seed}:{split}")


def generate_split(config: SplitTasksetConfig, make: Callable[[random.Random], T], key: Callable[[T], str]) -> list[T]:
    """The tasks of ``config.split``: ``make(rng)`` draws one item, ``key(item)`` identifies it.

    Test items are drawn first; train items whose key is a test key are skipped, so the splits never share
    a task. Raises ValueError when the generator cannot produce enough distinct items (a space too small).
    """
    test = _draw(split_rng(config.seed, "test"), make, key, config.num_test_examples, frozenset())
    if config.split == "test":
        return test
    banned = frozenset(key(item) for item in test)
    return _draw(split_rng(config.seed, "train"), make, key, config.num_train_examples, banned)


def _draw(
    rng: random.Random, make: Callable[[random.Random], T], key: Callable[[T], str], n: int, banned: frozenset
) -> list[T]:
    items: list[T] = []
    attempts = 0
    while len(items) < n:
        attempts += 1
        if attempts > 50 * n + 1000:
            raise ValueError(f"could not draw {n} items outside the other split after {attempts} attempts")
        item = make(rng)
        if key(item) not in banned:
            items.append(item)
    return items


def lcs_length(a: Sequence, b: Sequence) -> int:
    """Length of the longest common subsequence of two sequences (strings, lists of lines).

    O(len(a) * len(b)) time, O(len(b)) memory (the classic dynamic programme).
    """
    if not a or not b:
        return 0
    prev = [0] * (len(b) + 1)
    for ca in a:
        cur = [0]
        for j, cb in enumerate(b):
            cur.append(prev[j] + 1 if ca == cb else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


def lcs_ratio(reference: Sequence, answer: Sequence) -> float:
    """Similarity in [0, 1]: ``2 * LCS(reference, answer) / (len(reference) + len(answer))``.

    The same normalisation as ``difflib.SequenceMatcher.ratio`` (2M / T), with M the true longest common
    subsequence. 1.0 iff the strings are equal; 0.0 when either is empty (and the other is not).
    """
    if not reference and not answer:
        return 1.0
    return 2.0 * lcs_length(reference, answer) / (len(reference) + len(answer))


_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")


def last_number(text: str) -> float | None:
    """The last decimal number written in ``text`` (commas between digits ignored), or None if there is none."""
    found = _NUMBER.findall(text.replace(",", ""))
    return float(found[-1]) if found else None
