"""Summaries by hand: groups, steps, envs, errors, and the Student-t interval."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis.summary import env_summary, error_counts, group_stats, step_summary, student_t_ppf, t_interval


def _df() -> pd.DataFrame:
    # step 0: env a has one mixed group (1,0,1,0) and one all-zero group; env b one all-one group with an error.
    return pd.DataFrame(
        {
            "step": [0] * 12,
            "kind": ["train"] * 12,
            "env": ["a"] * 8 + ["b"] * 4,
            "group_id": [0] * 4 + [1] * 4 + [2] * 4,
            "reward": [1, 0, 1, 0, 0, 0, 0, 0, 1, 1, 1, 0.0],
            "error_class": [None] * 11 + ["TaskError"],
            "error_message": [None] * 11 + ["boom"],
            "truncated": [True] + [False] * 11,
            "completion_len": [10] * 12,
            "prompt_len": [5] * 12,
            "num_turns": [1] * 12,
            "off_policy_age": [0, 1] * 6,
        }
    ).astype({"reward": float})


def test_group_stats() -> None:
    g = group_stats(_df()).set_index("group_id")
    assert g.loc[0, "has_signal"] and not g.loc[0, "solve_none"] and not g.loc[0, "solve_all"]
    assert g.loc[1, "solve_none"] and not g.loc[1, "has_signal"]
    # the errored rollout (reward 0) is not counted: the group is solve-all over its 3 valid rollouts
    assert g.loc[2, "solve_all"] and g.loc[2, "valid"] == 3 and g.loc[2, "size"] == 4


def test_step_summary() -> None:
    s = step_summary(_df()).set_index("env")
    assert s.loc["a", "effective_batch_size"] == 4 and s.loc["b", "effective_batch_size"] == 0
    assert s.loc["all", "effective_batch_size"] == 4 and s.loc["all", "rollouts"] == 12
    assert s.loc["all", "solve_none"] == pytest.approx(1 / 3) and s.loc["all", "solve_all"] == pytest.approx(1 / 3)
    assert s.loc["b", "errored_rate"] == 0.25 and s.loc["all", "errored_rate"] == pytest.approx(1 / 12)
    assert s.loc["a", "reward_mean"] == 0.25 and s.loc["b", "reward_mean"] == 1.0
    assert s.loc["a", "truncated_rate"] == 0.125 and s.loc["all", "off_policy_age_max"] == 1


def test_env_summary_and_errors() -> None:
    e = env_summary(_df()).set_index("env")
    assert e.loc["a", "groups"] == 2 and e.loc["a", "solve_none"] == 0.5
    errs = error_counts(_df())
    assert errs.to_dict("records") == [
        {
            "kind": "train",
            "env": "b",
            "error_class": "TaskError",
            "count": 1,
            "first_step": 0,
            "last_step": 0,
            "first_message": "boom",
        }
    ]
    assert error_counts(_df().assign(error_class=None)).empty


@pytest.mark.parametrize(
    ("q", "df", "want"),
    [
        (0.975, 1, 12.7062),
        (0.975, 2, 4.3027),
        (0.975, 4, 2.7764),
        (0.975, 29, 2.0452),
        (0.95, 10, 1.8125),
        (0.995, 3, 5.8409),
    ],
)
def test_student_t_quantiles(q: float, df: int, want: float) -> None:
    assert student_t_ppf(q, df) == pytest.approx(want, abs=1e-4)


def test_t_interval() -> None:
    mean, low, high = t_interval(np.array([1.0, 2.0, 3.0]))
    assert mean == 2.0 and high - mean == pytest.approx(4.3027 * 1 / np.sqrt(3), rel=1e-4) and low < mean
    assert np.isnan(t_interval([5.0])[1]) and np.isnan(t_interval([])[0])
    with pytest.raises(ValueError):
        student_t_ppf(0.2, 3)
