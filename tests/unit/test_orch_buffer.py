"""Batch assembly: whole groups, errored rollouts, stale policies, filtering, trimming to a constant size."""

import pytest

from toolkit.orchestrator.buffer import BufferSettings, StepBatch
from toolkit.run.types import Rollout, TrainingSample


def _rollout(env, reward, *, version=0, error=None, n_tokens=3, example=0):
    smp = TrainingSample([1, 2], [5] * n_tokens, [True] * n_tokens, [-0.5] * n_tokens)
    return Rollout(
        env=env,
        task_id=f"t{example}",
        example_id=example,
        samples=[] if error else [smp],
        reward=reward,
        error_class=error,
        policy_version=version,
    )


def _group(env, rewards, **kw):
    return [_rollout(env, r, **kw) for r in rewards]


def test_whole_groups_fill_batch_and_advantages_are_set():
    b = StepBatch(step=1, settings=BufferSettings(batch_size=8))
    assert b.offer(_group("a", [1, 0, 0, 1])) is None
    assert not b.full and b.remaining == 4
    assert b.offer(_group("b", [0.2, 0.4, 0.6, 0.8])) is None
    assert b.full and len(b.rollouts) == 8
    assert [r.advantage for r in b.rollouts[:4]] == [0.5, -0.5, -0.5, 0.5]
    assert [r.advantage for r in b.rollouts[4:]] == pytest.approx([-0.3, -0.1, 0.1, 0.3])
    samples, _adv, versions, envs = b.training_samples()
    assert len(samples) == 8 and envs == ["a"] * 4 + ["b"] * 4 and versions == [0] * 8
    assert b.offer(_group("a", [1, 0, 1, 0])) == "overflow"
    assert len(b.recorded) == 12


def test_errored_rollouts_excluded_counted_per_env_and_advantage_over_valid_only():
    b = StepBatch(step=1, settings=BufferSettings(batch_size=8))
    g = _group("a", [1.0, 0.0, 0.0]) + [_rollout("a", 0.0, error="TaskError")]
    assert b.offer(g) is None
    assert len(b.rollouts) == 3
    assert b.errored == {"a": 1} and b.error_classes == {"TaskError": 1}
    assert [r.advantage for r in b.rollouts] == pytest.approx([2 / 3, -1 / 3, -1 / 3])
    assert all(r.error_class is None for r in b.rollouts)
    assert b.offer([_rollout("b", 0, error="ProviderError")] * 2) == "errored"


def test_constant_batch_size_cuts_last_group_in_launch_order():
    b = StepBatch(step=1, settings=BufferSettings(batch_size=6))
    b.offer(_group("a", [1, 0, 1, 0]))
    last = _group("a", [1, 0, 0, 0])
    assert b.offer(last) is None
    assert len(b.rollouts) == 6 and b.full and b.trimmed_rollouts == 2
    assert b.rollouts[4:] == last[:2]
    assert [r.advantage for r in last] == [0.75, -0.25, -0.25, -0.25]  # over the whole group


def test_filtering_drops_uniform_groups_with_reasons():
    b = StepBatch(step=1, settings=BufferSettings(batch_size=4, filtering=True, easy_threshold=0.9))
    assert b.offer(_group("a", [0, 0, 0, 0])) == "all_zero"
    assert b.offer(_group("a", [1, 1, 1, 1])) == "all_one"
    assert b.offer(_group("a", [0.95, 0.96, 0.97, 0.99])) == "easy"
    assert b.offer(_group("a", [0, 1, 0, 0])) is None
    assert b.dropped_groups == {"all_zero": 1, "all_one": 1, "easy": 1}
    assert b.dropped_rollouts["all_zero"] == 4
    assert b.signal_groups == 1 and b.full
    assert len(b.group_rewards) == 4  # dropped fresh groups still count for reward metrics


def test_oversampling_with_filtering_fills_exactly_when_enough_signal():
    # 2 groups needed; 4 offered (oversampling_factor 2): half are all-zero.
    b = StepBatch(step=1, settings=BufferSettings(batch_size=8, filtering=True))
    verdicts = [b.offer(_group("a", r)) for r in ([0] * 4, [1, 0, 0, 0], [0] * 4, [1, 1, 0, 0])]
    assert verdicts == ["all_zero", None, "all_zero", None]
    assert b.full and len(b.rollouts) == 8


def test_stale_groups_dropped_by_off_policy_bound():
    # step 5, bound 1: versions >= 5 - 1 - 1 = 3 allowed.
    b = StepBatch(step=5, settings=BufferSettings(batch_size=8, max_off_policy_steps=1))
    assert b.offer(_group("a", [1, 0], version=2)) == "off_policy"
    assert b.offer(_group("a", [1, 0], version=3)) is None
    assert b.offer(_group("a", [1, 0], version=4)) is None
    assert b.dropped_rollouts["off_policy"] == 2
    assert b.ages() == [1, 1, 0, 0]
    # a group's version is its oldest rollout's
    mixed = [_rollout("a", 1, version=4), _rollout("a", 0, version=2)]
    assert b.offer(mixed) == "off_policy"
    # No bound (negative control without weight updates): nothing is stale.
    nb = StepBatch(step=9, settings=BufferSettings(batch_size=2, max_off_policy_steps=None))
    assert nb.offer(_group("a", [1, 0], version=0)) is None and nb.ages() == [8, 8]


def test_a_rollout_without_sampled_tokens_never_ages_its_group():
    # An episode a request stop ended before any model call (or whose only reply a response hook replaced) has no
    # tokens and only a placeholder version; its group is as old as its sampled rollouts, and its age is 0.
    b = StepBatch(step=5, settings=BufferSettings(batch_size=8, max_off_policy_steps=1))
    tokenless = Rollout(env="a", task_id="t0", example_id=0, samples=[], reward=1.0, policy_version=0)
    assert b.offer([_rollout("a", 0, version=4), tokenless]) is None
    assert b.ages() == [0, 0]
    assert b.offer([tokenless, tokenless]) is None  # no tokens at all: nothing to be stale
    assert b.offer([_rollout("a", 0, version=2), tokenless]) == "off_policy"


def test_max_rl_through_builder():
    b = StepBatch(step=1, settings=BufferSettings(batch_size=4, algo="max_rl"))
    b.offer(_group("a", [1, 0, 0, 0]))
    assert [r.advantage for r in b.rollouts] == pytest.approx([3, -1, -1, -1])


def test_each_seat_of_a_game_gets_its_own_baseline():
    # Two episodes of a zero-sum two-seat game: in episode 1 p0 wins (+1, p1 -1), in episode 2 p1 wins. A shared
    # mean (0) would give p0's win and p1's win the same +1 whatever the seat; per seat, each seat's win is
    # measured against that seat's loss in the other episode.
    rows = [("p0", 1.0), ("p1", -1.0), ("p0", -1.0), ("p1", 1.0), ("p0", 1.0), ("p1", -1.0)]
    group = []
    for seat, reward in rows:
        r = _rollout("g", reward)
        r.seat = seat
        group.append(r)
    b = StepBatch(step=1, settings=BufferSettings(batch_size=6))
    assert b.offer(group) is None
    p0 = [r.advantage for r in b.rollouts if r.seat == "p0"]
    p1 = [r.advantage for r in b.rollouts if r.seat == "p1"]
    assert p0 == pytest.approx([2 / 3, -4 / 3, 2 / 3]) and p1 == pytest.approx([-2 / 3, 4 / 3, -2 / 3])
    # Rollouts without a seat (the chat loop, single-agent traces) keep one baseline for the whole group.
    b2 = StepBatch(step=1, settings=BufferSettings(batch_size=4))
    assert b2.offer(_group("a", [1, 0, 0, 1])) is None
    assert [r.advantage for r in b2.rollouts] == [0.5, -0.5, -0.5, 0.5]


def test_a_distilling_env_gets_no_advantages_is_never_filtered_and_carries_signal():
    settings = BufferSettings(batch_size=8, filtering=True, env_algos={"opd": ("opd", 0.0)})
    b = StepBatch(step=1, settings=settings)
    assert b.offer(_group("opd", [1, 1, 1, 1])) is None  # uniform rewards: a GRPO group would be dropped
    assert [r.advantage for r in b.rollouts] == [0.0] * 4
    assert b.signal_groups == 1  # the teacher's logprobs are its signal: never an "empty step"
    assert b.offer(_group("grpo", [1, 1, 1, 1])) == "all_one"  # the run's own algo still filters
    assert b.offer(_group("grpo", [1, 0, 0, 0])) is None
    assert [r.advantage for r in b.rollouts[4:]] == [0.75, -0.25, -0.25, -0.25]
    assert b.full and b.groups_kept == 2 and b.signal_groups == 2
