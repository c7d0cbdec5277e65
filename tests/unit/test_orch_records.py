"""Step metrics, exactly-once metrics lines, stop criteria, checkpoint state and eval metrics."""

import asyncio
import json

import pytest

from toolkit import checkpoints
from toolkit.config.model import SamplingConfig, SamplingOverride
from toolkit.config.model import StopCriteria as StopCfg
from toolkit.orchestrator.buffer import BufferSettings, StepBatch
from toolkit.orchestrator.evaluation import eval_metrics, pass_at_k
from toolkit.orchestrator.producer import Slots, sampling_params
from toolkit.orchestrator.records import MetricsLog, step_metrics
from toolkit.orchestrator.state import is_checkpoint_step, load_state, save_state
from toolkit.orchestrator.stop import StopChecks, ZeroSignalGuard
from toolkit.run.control import request_stop
from toolkit.run.layout import RunDir
from toolkit.run.metrics import recorded_steps
from toolkit.run.types import Rollout, TrainingSample


def _r(env, reward, *, version=0, error=None, truncated=False, turns=1, seat=None):
    smp = TrainingSample([1, 2, 3], [4, 5], [True, True], [-0.1, -0.2])
    return Rollout(
        env=env,
        task_id="t",
        example_id=0,
        samples=[] if error else [smp],
        reward=reward,
        error_class=error,
        policy_version=version,
        truncated=truncated,
        num_turns=turns,
        seat=seat,
    )


def test_step_metrics_names_and_values():
    b = StepBatch(step=3, settings=BufferSettings(batch_size=4, filtering=True, max_off_policy_steps=1))
    b.offer([_r("a", 1.0, version=2), _r("a", 0.0, version=2, truncated=True)])
    b.offer([_r("b", 0.0, version=1), _r("b", 0.0, version=1)])  # all_zero, filtered
    b.offer([_r("b", 0.5, version=0), _r("b", 0.2, version=0)])  # stale (age 2 > 1)
    b.offer([_r("b", 0.3, version=2), _r("b", 0.0, error="TaskError")])
    m = step_metrics(b)
    assert m["reward/all/mean"] == pytest.approx((1 + 0 + 0 + 0 + 0.3) / 5)
    assert m["reward/a/max"] == 1.0 and m["reward/b/min"] == 0.0
    assert m["solve_none"] == pytest.approx(1 / 3) and m["solve_all"] == 0.0
    # the last group has one valid rollout left: uniform, so filtered
    assert m["effective_batch_size"] == 2 and m["batch/a/rollouts"] == 2 and "batch/b/rollouts" not in m
    assert m["filter/dropped_groups/uniform"] == 1
    assert m["errored_rollouts"] == 1 and m["errored_rollouts/b"] == 1 and m["error/TaskError"] == 1
    assert m["truncated_rollouts"] == 1
    assert m["off_policy/dropped"] == 2 and m["off_policy/max"] == 0 and m["off_policy/mean"] == 0
    assert m["filter/dropped_groups/all_zero"] == 1 and m["filter/dropped_groups/off_policy"] == 1
    assert m["seq_len/mean"] == 5 and m["completion_len/mean"] == 2 and m["num_turns/mean"] == 1
    assert m["rollouts_offered"] == 8


def test_an_env_with_several_seats_gets_a_reward_per_seat():
    b = StepBatch(step=1, settings=BufferSettings(batch_size=6, filtering=False, max_off_policy_steps=1))
    # One episode of a two-player game per pair: each seat's trace is a rollout of the group.
    b.offer(
        [
            _r("game", 1.0, seat="left"),
            _r("game", 0.0, seat="right"),
            _r("game", 0.5, seat="left"),
            _r("game", 0.25, seat="right"),
        ]
    )
    b.offer([_r("solo", 1.0, seat="agent"), _r("solo", 0.0, seat="agent")])
    m = step_metrics(b)
    assert m["reward/game/seat/left/mean"] == pytest.approx(0.75) and m["reward/game/seat/left/min"] == 0.5
    assert m["reward/game/seat/right/mean"] == pytest.approx(0.125) and m["reward/game/seat/right/max"] == 0.25
    assert m["reward/game/mean"] == pytest.approx(0.4375)
    assert not [k for k in m if k.startswith("reward/solo/seat/")]  # one seat: the env's reward says it all


def test_metrics_lines_written_once_across_attempts(tmp_path):
    run = RunDir(tmp_path)
    first = MetricsLog(run)
    assert first.write(1, {"x": 1.0}) and first.write(2, {"x": 2.0})
    assert not first.write(2, {"x": 9.0})
    with open(run.metrics, "a") as f:
        f.write('{"step": 3, "role": "trainer"}\n{"step": 4, "role": "orch')  # torn last line, other role
    second = MetricsLog(run)  # a new attempt
    assert second.done == {1, 2}
    assert not second.write(1, {"x": 5.0}) and second.write(3, {"x": 3.0})
    text = run.metrics.read_text().splitlines()
    assert text[-2] == '{"step": 4, "role": "orch'  # the torn line stays alone on its line
    lines = [json.loads(l) for l in text if l.endswith("}")]
    orch = [l["step"] for l in lines if l.get("role") == "orchestrator"]
    assert sorted(orch) == [1, 2, 3] and recorded_steps(run.metrics, "orchestrator") == {1, 2, 3}


def test_zero_signal_guard_counts_consecutive_empty_steps(caplog):
    g = ZeroSignalGuard(max_empty_steps=3)
    kw = {"groups_offered": 4, "groups_kept": 0, "dropped": {"all_zero": 4}}
    assert g.observe(1, signal_groups=0, **kw) is None
    assert g.observe(2, signal_groups=0, **kw) is None
    assert g.observe(3, signal_groups=1, **kw) is None  # signal resets the count
    assert g.observe(4, signal_groups=0, **kw) is None
    assert g.observe(5, signal_groups=0, **kw) is None
    reason = g.observe(6, signal_groups=0, **kw)
    assert reason and "3 consecutive steps" in reason and "all_zero" in reason
    assert "4 groups offered" in caplog.text
    assert ZeroSignalGuard(None).observe(1, signal_groups=0, **kw) is None


def test_errored_share_and_mismatch_kl_criteria(tmp_path):
    run = RunDir(tmp_path)
    sc = StopChecks(
        StopCfg(max_errored_share=0.5, errored_patience_steps=2, max_mismatch_kl=0.1, mismatch_kl_patience_steps=1),
        run.metrics,
    )

    def step(n, errored, offered=10):
        return sc.check(n, {"errored_rollouts": errored, "rollouts_offered": offered})

    assert step(1, 6) is None
    assert step(2, 5) is None  # 50% is not above 50%: the streak resets
    assert step(3, 6) is None
    assert "2 steps" in step(4, 9)
    with open(run.metrics, "a") as f:
        f.write('{"role": "trainer", "step": 1, "mismatch_kl/mean": 0.01}\n')
    assert step(5, 0) is None
    with open(run.metrics, "a") as f:
        f.write('{"role": "trainer", "step": 2, "mismatch_kl/mean": 0.5}\n')
    assert "mismatch_kl 0.5" in step(6, 0)
    request_stop(run, "because")
    assert run.stop_request.read_text() == "orchestrator: because\n"


def test_state_round_trip_and_complete_marker(tmp_path):
    run = RunDir(tmp_path)
    save_state(run, 4, {"sampler": {"seed": 0}, "next_group_id": 12})
    assert load_state(run, 4)["next_group_id"] == 12 and load_state(run, 5) is None
    assert not checkpoints.is_complete(run.checkpoint_step(4))  # trainer part missing
    (run.checkpoint_step(6) / "trainer").mkdir(parents=True)
    save_state(run, 6, {})
    assert checkpoints.is_complete(run.checkpoint_step(6))
    assert [s for s in range(1, 11) if is_checkpoint_step(s, 10, 4)] == [4, 8, 10]
    assert [s for s in range(1, 6) if is_checkpoint_step(s, 5, None)] == [5]


def test_pass_at_k_and_eval_metrics():
    assert pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 1, 4) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    with pytest.raises(ValueError):
        pass_at_k(2, 3, 1)
    groups = [
        [_r("e", 1.0), _r("e", 0.0)],
        [_r("e", 0.5), _r("e", 0.0)],
        [_r("e", 0.0, error="ProviderError")] * 2,
    ]
    m = eval_metrics("e", groups, 2)
    assert m["eval/e/avg@2"] == pytest.approx(1.5 / 4)
    assert m["eval/e/pass@2"] == pytest.approx(0.5)  # partial credit 0.5 is not a solve
    assert m["eval/e/errored"] == 2 and m["eval/e/examples"] == 3


def test_sampling_params_override():
    sp = sampling_params(SamplingConfig(temperature=0.7, max_completion_tokens=64), SamplingOverride(top_p=0.9))
    assert (sp.temperature, sp.top_p, sp.max_tokens, sp.top_k) == (0.7, 0.9, 64, None)


def test_batch_records_the_sampling_its_train_envs_drew_with():
    """What the trainer applies to its logits comes from here: the orchestrator's record in the batch."""
    from toolkit.batches import samples_to_batch
    from toolkit.orchestrator.main import sampling_record
    from toolkit.orchestrator.producer import TrainEnv

    sp = sampling_params(SamplingConfig(temperature=0.7, top_p=0.8, top_k=20, max_completion_tokens=64))
    envs = {"a": TrainEnv("a", None, 2, sp), "b": TrainEnv("b", None, 2, sp)}
    rec = sampling_record(envs, ["a", "b", "a"])
    assert rec == {"temperature": 0.7, "top_p": 0.8, "top_k": 20}
    sample = TrainingSample([1, 2], [3], [True], [-0.5])
    batch = samples_to_batch(1, [sample], [1.0], policy_versions=[0], envs=["a"], meta={"sampling": rec})
    assert (batch.sampling.temperature, batch.sampling.top_p, batch.sampling.top_k) == (0.7, 0.8, 20)
    hot = sampling_params(SamplingConfig(temperature=1.0, max_completion_tokens=64))
    with pytest.raises(ValueError, match="different temperature"):
        sampling_record({**envs, "b": TrainEnv("b", None, 2, hot)}, ["a", "b"])


def test_slots_take_a_group_atomically():
    async def go():
        slots = Slots(4)
        order = []

        async def group(name, n, hold_s):
            async with slots.hold(n):
                order.append((name, slots.used))
                await asyncio.sleep(hold_s)

        # Two groups of 3 cannot both fit in 4 slots; they must run one after the other, never deadlock.
        await asyncio.wait_for(asyncio.gather(group("a", 3, 0.02), group("b", 3, 0.02), group("c", 1, 0.0)), 2)
        return order

    order = asyncio.run(go())
    assert max(u for _, u in order) <= 4 and {n for n, _ in order} == {"a", "b", "c"}
