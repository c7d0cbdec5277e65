"""Online difficulty filtering: binary and continuous rewards."""

import pytest

from toolkit.orchestrator.filtering import drop_reason, is_uniform, solve_rates


@pytest.mark.parametrize(
    "rewards, reason",
    [([0, 0, 0, 0], "all_zero"), ([1, 1, 1, 1], "all_one"), ([0, 1, 0, 0], None), ([1, 1, 0, 1], None)],
)
def test_binary_groups(rewards, reason):
    assert drop_reason([float(r) for r in rewards], enabled=True) == reason


def test_filtering_off_keeps_uniform_groups_but_never_empty_ones():
    assert drop_reason([1.0, 1.0], enabled=False) is None
    assert drop_reason([], enabled=False) == "errored"
    assert drop_reason([], enabled=True) == "errored"


def test_continuous_rewards_use_thresholds_not_equality():
    # Nearly-solved continuous group: not all equal to 1, so equality checks keep it; the threshold drops it.
    easy = [0.97, 0.99, 0.96, 1.0]
    assert drop_reason(easy, enabled=True) is None
    assert drop_reason(easy, enabled=True, easy_threshold=0.95) == "easy"
    hard = [0.01, 0.03, 0.0, 0.02]
    assert drop_reason(hard, enabled=True) is None
    assert drop_reason(hard, enabled=True, hard_threshold=0.05) == "hard"
    mixed = [0.2, 0.9, 0.5, 0.4]  # mean 0.5
    assert drop_reason(mixed, enabled=True, easy_threshold=0.95, hard_threshold=0.05) is None
    # Threshold is inclusive on the mean.
    assert drop_reason([0.4, 0.6], enabled=True, easy_threshold=0.5) == "easy"


def test_uniform_non_binary_value_and_tolerance():
    assert drop_reason([0.5, 0.5, 0.5], enabled=True) == "uniform"
    assert is_uniform([0.3, 0.3 + 1e-12])
    assert not is_uniform([0.3, 0.3001])


def test_solve_rates():
    groups = [[0.0, 0.0], [1.0, 1.0], [0.0, 1.0], [1.0, 1.0], []]
    none, every = solve_rates(groups)
    assert none == pytest.approx(1 / 4) and every == pytest.approx(2 / 4)
    assert solve_rates([]) == (0.0, 0.0)
