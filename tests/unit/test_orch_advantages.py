"""Advantages computed by hand (grpo, max_rl, length penalty)."""

import pytest

from toolkit.orchestrator.advantages import group_advantages, penalized_rewards


def test_grpo_is_reward_minus_group_mean():
    # mean of [1, 0, 0, 1] is 0.5
    assert group_advantages([1.0, 0.0, 0.0, 1.0], "grpo") == [0.5, -0.5, -0.5, 0.5]
    # mean of [0.2, 0.5, 0.8] is 0.5
    assert group_advantages([0.2, 0.5, 0.8], "grpo") == pytest.approx([-0.3, 0.0, 0.3])


def test_max_rl_divides_centred_reward_by_mean():
    # binary, 1 of 4 solved: mean 0.25 -> (1-0.25)/0.25 = 3, (0-0.25)/0.25 = -1
    assert group_advantages([1.0, 0.0, 0.0, 0.0], "max_rl") == pytest.approx([3.0, -1.0, -1.0, -1.0])
    # 3 of 4 solved: mean 0.75 -> 1/3 and -1
    assert group_advantages([1.0, 1.0, 1.0, 0.0], "max_rl") == pytest.approx([1 / 3, 1 / 3, 1 / 3, -1.0])


def test_no_signal_groups_get_zeros():
    assert group_advantages([0.0, 0.0, 0.0], "max_rl") == [0.0, 0.0, 0.0]  # mean 0: no division
    assert group_advantages([1.0, 1.0], "grpo") == [0.0, 0.0]
    assert group_advantages([0.7], "grpo") == [0.0]
    assert group_advantages([], "grpo") == []


def test_advantages_sum_to_zero_grpo():
    adv = group_advantages([0.1, 0.9, 0.4, 0.35, 0.0], "grpo")
    assert sum(adv) == pytest.approx(0.0, abs=1e-12)


def test_length_penalty_applied_before_centring():
    # penalty 0.5, max 100 tokens: lens 0 and 100 -> rewards 1.0 and 1.0 - 0.5 = 0.5
    assert penalized_rewards([1.0, 1.0], [0, 100], length_penalty=0.5, max_completion_tokens=100) == [
        1.0,
        0.5,
    ]
    adv = group_advantages(
        penalized_rewards([1.0, 1.0], [0, 100], length_penalty=0.5, max_completion_tokens=100), "grpo"
    )
    assert adv == pytest.approx([0.25, -0.25])


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="unknown advantage algo"):
        group_advantages([1.0], "ppo")
    with pytest.raises(ValueError, match="completion length"):
        penalized_rewards([1.0], None, length_penalty=0.1, max_completion_tokens=10)
    with pytest.raises(ValueError, match="max_completion_tokens"):
        penalized_rewards([1.0], [3], length_penalty=0.1, max_completion_tokens=0)
