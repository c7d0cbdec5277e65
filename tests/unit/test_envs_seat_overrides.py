"""What srl's env config puts on verifiers' agent seats (toolkit.envs.traces.seat_overrides), on real verifiers
config classes: runtime on every seat, harness where the env leaves it unset, limits, and the stage timeouts the
user moved off srl's defaults where the seat declares none."""

from __future__ import annotations

from prereqs import need_module

from toolkit.config.model import TimeoutConfig
from toolkit.envs.runtime import _timeouts_given


def _config_class():
    vf = need_module("verifiers.v1")

    class TwoSeats(vf.EnvConfig):
        solver: vf.AgentConfig = vf.AgentConfig()
        judge: vf.AgentConfig = vf.AgentConfig(timeout={"scoring": 300.0}, harness={"id": "null"})

    return TwoSeats


def test_seats_get_runtime_harness_limits_and_the_stage_timeouts_given():
    from toolkit.envs.traces import seat_overrides

    spec = {
        "harness": {"id": "default", "runtime": {"type": "subprocess"}},
        "max_turns": 4,
        "timeout": {"setup": 120.0, "rollout": 30.0, "finalize": 120.0, "scoring": 15.0},
        "timeout_given": ["rollout", "scoring"],
    }
    out = seat_overrides(spec, _config_class(), bundles_harness=False)
    assert set(out) == {"solver", "judge"}
    assert out["solver"]["harness"] == {"id": "null"} and out["solver"]["max_turns"] == 4
    assert out["solver"]["timeout"] == {"scoring": 15.0}  # rollout: srl's own bound on the whole episode
    assert "harness" not in out["judge"]  # pinned by the env
    assert "timeout" not in out["judge"]  # its own scoring bound stays
    assert all(seat["runtime"]["type"] == "subprocess" for seat in out.values())
    del spec["timeout_given"]
    assert "timeout" not in seat_overrides(spec, _config_class(), bundles_harness=False)["solver"]


def test_only_stages_moved_off_the_defaults_count_as_given():
    from types import SimpleNamespace

    assert _timeouts_given(SimpleNamespace(timeout=TimeoutConfig())) == []
    assert _timeouts_given(SimpleNamespace(timeout=TimeoutConfig(rollout=60, scoring=10))) == ["rollout", "scoring"]
