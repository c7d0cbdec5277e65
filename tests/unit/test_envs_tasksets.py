"""Built-in tasksets: rewards on known answers, determinism, disjoint splits, select."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from prereqs import need_module

need_module("verifiers.v1")

from local_session import LocalSession

from toolkit.envs.registry import load_tasks
from toolkit.envs.tasksets.alphabet_sort import expected_lists
from toolkit.envs.tasksets.common import lcs_ratio


def ts(id_: str, split: str = "train", seed: int = 0, select=None, **extra):
    return SimpleNamespace(id=id_, split=split, seed=seed, select=select, model_extra=extra)


def play(task, replies: list[str], max_turns: int | None = None) -> dict:
    """Run the plain chat harness on ``task`` with scripted assistant replies; return the score dict."""

    async def go():
        session = LocalSession(task, max_turns=max_turns)
        await session.start()
        for reply in replies:
            _, done = await session.step(reply)
            if done:
                break
        return await session.finish()

    return asyncio.run(go())


def test_lcs_ratio_reference_values():
    assert lcs_ratio("abc", "abc") == 1.0
    assert lcs_ratio("abc", "") == 0.0
    assert lcs_ratio("abcd", "abdc") == pytest.approx(2 * 3 / 8)
    assert lcs_ratio(["a", "b"], ["b", "a"]) == pytest.approx(0.5)


def test_reverse_text_rewards():
    tasks = load_tasks(ts("srl-reverse-text", select={"limit": 5}, num_train_examples=20, num_test_examples=5))
    assert len(tasks) == 5
    for task in tasks:
        text = task.data.text
        assert 3 <= len(text) <= 8 and text.isalpha() and text.islower()
        assert play(task, [text[::-1]])["reward"] == 1.0
        assert play(task, [""])["reward"] == 0.0
        unreversed = play(task, [text])["reward"]
        assert 0.0 < unreversed < 1.0 or text == text[::-1]
        # Filler special tokens are part of the reply and cost reward.
        assert play(task, [text[::-1] + "<|im_end|><|im_end|>"])["reward"] < 1.0


def test_arith_rewards():
    task = load_tasks(ts("srl-arith", num_train_examples=10, num_test_examples=5))[0]
    answer = task.data.answer
    assert play(task, [str(answer)])["reward"] == 1.0
    assert play(task, [f"The answer is {answer}.0"])["reward"] == 1.0
    assert play(task, [str(answer + 1)])["reward"] == 0.0
    assert play(task, [""])["reward"] == 0.0
    assert play(task, ["no digits here"])["reward"] == 0.0


def test_alphabet_sort_multi_turn_rewards():
    task = load_tasks(ts("srl-alphabet-sort", num_turns=3, names_per_turn=2, num_train_examples=5))[0]
    expected = expected_lists(task.data.turns)
    perfect = ["\n".join(e) for e in expected]
    scored = play(task, perfect)
    assert scored["reward"] == 1.0 and scored["metrics"]["final_exact"] == 1.0
    assert play(task, ["", "", ""])["reward"] == 0.0
    # Only the first turn right: 1/3 of the reward.
    assert play(task, [perfect[0], "", ""])["reward"] == pytest.approx(1 / 3)
    # Reversed (wrong) order on every turn is partial credit, never full.
    wrong = play(task, ["\n".join(reversed(e)) for e in expected])["reward"]
    assert 0.0 < wrong < 1.0
    # max_turns=2 stops early: truncated episode, last turn counts 0, the env says it wanted more.
    short = play(task, perfect, max_turns=2)
    assert short["reward"] == pytest.approx(2 / 3) and short["wants_more"]


def test_deterministic_and_disjoint_splits():
    for id_ in ("srl-reverse-text", "srl-arith", "srl-alphabet-sort"):
        a = [t.data.model_dump() for t in load_tasks(ts(id_, seed=3, num_train_examples=50, num_test_examples=20))]
        b = [t.data.model_dump() for t in load_tasks(ts(id_, seed=3, num_train_examples=50, num_test_examples=20))]
        assert a == b
        other = [t.data.model_dump() for t in load_tasks(ts(id_, seed=4, num_train_examples=50))]
        assert a != other
        test = load_tasks(ts(id_, split="test", seed=3, num_test_examples=20))
        key = lambda d: d["prompt"]
        assert not {key(d) for d in a} & {t.data.prompt for t in test}


def test_select_include_exclude_shuffle_skip_limit():
    base = [t.data.id for t in load_tasks(ts("srl-arith", num_train_examples=30))]
    assert [t.data.id for t in load_tasks(ts("srl-arith", num_train_examples=30, select={"limit": 4}))] == base[:4]
    assert [t.data.id for t in load_tasks(ts("srl-arith", num_train_examples=30, select={"skip": 2, "limit": 3}))] == (
        base[2:5]
    )
    inc = load_tasks(
        ts("srl-arith", num_train_examples=30, select={"include": [1, "5:7"], "exclude": ["arith/train/6"]})
    )
    assert [t.data.id for t in inc] == [base[1], base[5]]
    shuffled = [t.data.id for t in load_tasks(ts("srl-arith", num_train_examples=30, select={"shuffle": True}))]
    assert sorted(shuffled) == sorted(base) and shuffled != base
    again = [t.data.id for t in load_tasks(ts("srl-arith", num_train_examples=30, select={"shuffle": True}))]
    assert again == shuffled
