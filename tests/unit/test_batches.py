"""Rollout-batch file format: round trip, atomic visibility, bounded wait."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from toolkit import batches
from toolkit.run.layout import RunDir
from toolkit.run.types import TrainingSample


def _samples():
    return [
        TrainingSample([1, 2, 3], [4, 5], [True, True], [-0.5, -1.5]),
        TrainingSample([7], [8, 9, 10], [True, False, True], [-0.1, 0.0, -2.0]),
    ]


def test_round_trip(tmp_path):
    run = RunDir(tmp_path)
    path = batches.write_batch(
        run, 3, _samples(), [1.0, -0.5], policy_versions=[2, 1], envs=["a", "b"], meta={"temperature": 1.0}
    )
    assert path == run.rollout_step(3)
    assert (path / "READY").is_file()
    b = batches.read_batch(run, 3, timeout_s=1.0)
    assert b.step == 3 and b.num_samples == 2 and b.num_tokens == 9
    assert b.input_ids.tolist() == [1, 2, 3, 4, 5, 7, 8, 9, 10]
    assert b.offsets.tolist() == [0, 5, 9]
    assert b.loss_mask.tolist() == [False] * 3 + [True, True] + [False, True, False, True]
    np.testing.assert_allclose(b.inference_logprobs, [0, 0, 0, -0.5, -1.5, 0, -0.1, 0, -2.0])
    np.testing.assert_allclose(b.advantages, [0, 0, 0, 1, 1, 0, -0.5, -0.5, -0.5])
    assert not b.ce_mask.any()
    assert b.policy_version.tolist() == [2, 1] and b.envs == ["a", "b"] and b.meta == {"temperature": 1.0}
    assert b.prompt_lens.tolist() == [3, 1]


def test_rejects_mismatched_lengths(tmp_path):
    run = RunDir(tmp_path)
    with pytest.raises(ValueError, match="advantages"):
        batches.write_batch(run, 1, _samples(), [1.0], policy_versions=[0, 0], envs=["a", "a"], meta={})
    bad = [TrainingSample([1], [2, 3], [True], [-1.0, -1.0])]
    with pytest.raises(ValueError, match="lengths differ"):
        batches.write_batch(run, 1, bad, [1.0], policy_versions=[0], envs=["a"], meta={})
    # An empty prompt would put loss on a token without context.
    no_prompt = [TrainingSample([], [2, 3], [True, True], [-1.0, -1.0])]
    with pytest.raises(ValueError, match="first token"):
        batches.write_batch(run, 1, no_prompt, [1.0], policy_versions=[0], envs=["a"], meta={})
    assert not run.rollout_step(1).exists()


def test_read_waits_then_times_out_naming_path(tmp_path):
    run = RunDir(tmp_path)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="step_5"):
        batches.read_batch(run, 5, timeout_s=0.2, poll_s=0.02)
    assert 0.15 < time.monotonic() - t0 < 1.0


def test_read_sees_batch_written_while_waiting(tmp_path):
    run = RunDir(tmp_path)
    writer = threading.Timer(
        0.1,
        lambda: batches.write_batch(run, 2, _samples(), [1.0, 1.0], policy_versions=[0, 0], envs=["a", "a"], meta={}),
    )
    writer.start()
    b = batches.read_batch(run, 2, timeout_s=5.0, poll_s=0.01)
    writer.join()
    assert b is not None and b.num_samples == 2


def test_read_returns_none_on_stop(tmp_path):
    run = RunDir(tmp_path)
    assert batches.read_batch(run, 1, timeout_s=5.0, should_stop=lambda: True) is None


def test_directory_without_ready_is_not_read(tmp_path):
    run = RunDir(tmp_path)
    path = batches.write_batch(run, 1, _samples(), [1.0, 1.0], policy_versions=[0, 0], envs=["a", "a"], meta={})
    (path / "READY").unlink()  # what a reader would see of a writer that died before the marker
    with pytest.raises(TimeoutError):
        batches.read_batch(run, 1, timeout_s=0.1, poll_s=0.02)


def test_distillation_samples_feed_the_ref_kl_term_not_the_rl_term(tmp_path):
    run = RunDir(tmp_path)
    rl, opd = _samples()[0], TrainingSample([7], [8, 9, 10], [True, False, True], [-0.1, 0.0, -2.0], [-0.3, 5.0, -1.0])
    batches.write_batch(run, 1, [rl, opd], [1.0, 0.0], policy_versions=[0, 0], envs=["rl", "opd"], meta={})
    b = batches.read_batch(run, 1, timeout_s=1.0)
    assert b.loss_mask.tolist() == [False] * 3 + [True, True] + [False] * 4
    assert b.ref_kl_mask.tolist() == [False] * 5 + [False, True, False, True]
    # the teacher's logprob only where the policy sampled (the env's token keeps 0.0 whatever was sent)
    np.testing.assert_allclose(b.ref_logprobs, [0, 0, 0, 0, 0, 0, -0.3, 0, -1.0])
    np.testing.assert_allclose(b.inference_logprobs[5:], [0, -0.1, 0, -2.0])  # the sampler's, for the ratio
    bad = TrainingSample([7], [8, 9], [True, True], [-0.1, -0.2], [-0.3])
    with pytest.raises(ValueError, match="ref_logprobs has 1 entries for 2"):
        batches.write_batch(run, 2, [bad], [0.0], policy_versions=[0], envs=["opd"], meta={})


def test_batch_written_without_distillation_arrays_still_loads(tmp_path):
    # A batch from before the ref-KL term (resumed run): read as "no distillation".
    from safetensors.numpy import load, save

    run = RunDir(tmp_path)
    path = batches.write_batch(run, 1, _samples(), [1.0, -0.5], policy_versions=[0, 0], envs=["a", "b"], meta={})
    arrays = load((path / batches.BATCH_FILE).read_bytes())
    old = {k: v for k, v in arrays.items() if not k.startswith("ref_")}
    (path / batches.BATCH_FILE).write_bytes(save(old))
    b = batches.load_batch_dir(path)
    assert not b.ref_kl_mask.any() and b.ref_logprobs.shape == (9,) and not b.ref_logprobs.any()


def test_topk_lists_travel_per_policy_token(tmp_path):
    run = RunDir(tmp_path)
    opd = TrainingSample([7], [8, 9, 10], [True, False, True], [-0.1, 0.0, -2.0], [-0.3, 0.0, -1.0])
    opd.ref_topk_ids = [[8, 1], [5, 5], [10, 2]]
    opd.ref_topk_logprobs = [[-0.3, -1.5], [-9.0, -9.0], [-1.0, -0.7]]
    batches.write_batch(run, 1, [_samples()[0], opd], [1.0, 0.0], policy_versions=[0, 0], envs=["rl", "opd"], meta={})
    b = batches.read_batch(run, 1, timeout_s=1.0)
    assert b.ref_topk_ids.shape == (9, 2) and b.ref_topk_logprobs.dtype == np.float32
    assert b.ref_topk_ids[5:].tolist() == [[0, 0], [8, 1], [0, 0], [10, 2]]  # prompt and env token: zeros
    np.testing.assert_allclose(b.ref_topk_logprobs[6], [-0.3, -1.5])
    assert not b.ref_topk_ids[:5].any()  # the RL sample has none
