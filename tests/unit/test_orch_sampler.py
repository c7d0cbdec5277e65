"""Ratio sampling of train envs: converges to the configured mix; deterministic; state save/restore."""

import json
from collections import Counter

import pytest

from toolkit.orchestrator.sampler import EnvSampler

# Upper 0.1% points of the chi-square distribution (NIST/SEMATECH e-Handbook, table 1.3.6.7.4).
CHI2_CRIT_0_001 = {1: 10.828, 2: 13.816, 3: 16.266}


def _chi2(counts: Counter, probs: dict[str, float], n: int) -> float:
    return sum((counts[k] - n * p) ** 2 / (n * p) for k, p in probs.items())


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_ratio_mix_chi_square(seed):
    ratios = {"math": 3.0, "tools": 1.0, "sort": 2.0}
    s = EnvSampler({k: range(10) for k in ratios}, ratios, seed=seed)
    n = 20000
    counts = Counter(s.next_env() for _ in range(n))
    stat = _chi2(counts, {"math": 3 / 6, "tools": 1 / 6, "sort": 2 / 6}, n)
    assert stat < CHI2_CRIT_0_001[2], (counts, stat)


def test_chi_square_detects_a_wrong_mix():
    # The test itself can fail: counts drawn with equal weights do not fit a 3:1 mix.
    s = EnvSampler({"a": [0], "b": [0]}, {"a": 1.0, "b": 1.0}, seed=0)
    n = 20000
    counts = Counter(s.next_env() for _ in range(n))
    assert _chi2(counts, {"a": 0.75, "b": 0.25}, n) > CHI2_CRIT_0_001[1]


def test_no_ratio_means_equal_weights_and_single_env():
    s = EnvSampler({"a": [0], "b": [1]}, {"a": None, "b": None}, seed=0)
    n = 20000
    assert _chi2(Counter(s.next_env() for _ in range(n)), {"a": 0.5, "b": 0.5}, n) < CHI2_CRIT_0_001[1]
    one = EnvSampler({"only": [5, 6]}, seed=3)
    assert {one.draw()[0] for _ in range(10)} == {"only"}


def test_examples_cover_each_epoch_before_repeating():
    ids = [10, 11, 12, 13, 14]
    s = EnvSampler({"e": ids}, seed=4)
    first = [s.next_example("e") for _ in range(5)]
    second = [s.next_example("e") for _ in range(5)]
    assert sorted(first) == ids and sorted(second) == ids
    assert first != second  # a fresh permutation per epoch (for this seed)


def test_deterministic_and_state_round_trip():
    a = EnvSampler({"x": range(7), "y": range(3)}, {"x": 2, "y": 1}, seed=11)
    b = EnvSampler({"x": range(7), "y": range(3)}, {"x": 2, "y": 1}, seed=11)
    assert [a.draw() for _ in range(50)] == [b.draw() for _ in range(50)]
    state = json.loads(json.dumps(a.state_dict()))  # must survive JSON
    expected = [a.draw() for _ in range(40)]
    c = EnvSampler({"x": range(7), "y": range(3)}, {"x": 2, "y": 1}, seed=11)
    c.load_state_dict(state)
    assert [c.draw() for _ in range(40)] == expected
    assert c.draws == 90


def test_bad_inputs():
    with pytest.raises(ValueError, match="no examples"):
        EnvSampler({"e": []})
    with pytest.raises(ValueError, match="ratios must be > 0"):
        EnvSampler({"e": [1]}, {"e": 0.0})
    s = EnvSampler({"e": [1]}, seed=1)
    with pytest.raises(ValueError, match="seed"):
        EnvSampler({"e": [1]}, seed=2).load_state_dict(s.state_dict())
