"""[monitors.stop] criteria over consecutive steps."""

from __future__ import annotations

import pytest

from toolkit.config.model import StopCriteria
from toolkit.run.stop import StopMonitor, criteria_from_table, replay


def test_errored_share_needs_patience() -> None:
    crit = criteria_from_table({"max_errored_share": 0.2, "errored_patience_steps": 2})
    m = StopMonitor(crit)
    assert m.update(0, {"errored_share": 0.5}) is None
    assert m.update(1, {"errored_share": 0.1}) is None  # streak broken
    assert m.update(2, {"errored_share": 0.3}) is None
    assert m.update(3, {"errored_share": 0.3}) == "step 3: errored rollouts 30% > 20% for 2 steps"


def test_mismatch_kl_and_reward_collapse() -> None:
    crit = StopCriteria(
        max_mismatch_kl=0.01,
        mismatch_kl_patience_steps=1,
        reward_collapse_fraction=0.5,
        reward_collapse_patience_steps=2,
    )
    steps = [
        (0, {"reward/all/mean": 0.6, "mismatch_kl/mean": 0.001}),
        (1, {"reward/all/mean": 0.2}),
        (2, {"reward/all/mean": 0.25}),
        (3, {"mismatch_kl/mean": 0.5}),
    ]
    step, reason = replay(crit, steps)
    assert step == 2 and "reward collapsed to 0.25" in reason
    assert replay(StopCriteria(max_mismatch_kl=0.01, mismatch_kl_patience_steps=1), steps)[0] == 3
    assert replay(StopCriteria(), steps) is None
    # The config's defaults are the monitor's: the errored-share criterion is on unless switched off.
    assert StopCriteria().enabled and StopCriteria().max_errored_share == 0.5
    assert not StopCriteria(max_errored_share=None).enabled


def test_bad_table() -> None:
    with pytest.raises(ValueError, match="unknown key 'patience_steps'"):
        criteria_from_table({"patience_steps": 3})
    with pytest.raises(ValueError, match="max_errored_share.*less than or equal to 1"):
        criteria_from_table({"max_errored_share": 2})
    with pytest.raises(ValueError, match="errored_patience_steps.*greater than or equal to 1"):
        criteria_from_table({"errored_patience_steps": 0})
