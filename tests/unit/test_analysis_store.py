"""Rollout store: round trips through the writer and reader, schema, crash and concurrent-reader behaviour."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pytest

from analysis.store import BASE_COLUMNS, RolloutStoreWriter, load_rollouts, read_rollouts, store_columns
from toolkit.orchestrator.types import Rollout, TrainingSample

ROOT = Path(__file__).resolve().parents[2]


def _rollout(i: int, **kw) -> Rollout:
    samples = [TrainingSample([1, 2, i], [4, 5, 6 + i], [True, False, True], [-0.5, 0.0, -0.125])]
    if i % 3 == 0:  # a split multi-turn trajectory: two samples
        samples.append(TrainingSample([1, 2, i, 4, 5], [9] * i, [True] * i, [-1.0] * i))
    base = {
        "env": "arith" if i % 2 else "reverse-text",
        "task_id": f"t{i // 4}",
        "example_id": i // 4,
        "samples": samples,
        "reward": i / 10,
        "reward_components": {"correct": float(i % 2)},
        "num_turns": 1 + i % 3,
        "truncated": i == 5,
        "truncation_reason": "max_tokens" if i == 5 else None,
        "policy_version": 3,
        "group_id": i // 4,
        "advantage": i / 10 - 0.15,
        "timings": {"generate": 0.25 * i},
        "metrics": {"lcs": 0.5},
    }
    base.update(kw)
    return Rollout(**base)


def test_round_trip_rollouts_and_tokens(tmp_path: Path) -> None:
    path = tmp_path / "a" / "store" / "rollouts.h5"
    first = [_rollout(i) for i in range(8)]
    second = [
        _rollout(
            i,
            error_class="TaskError",
            error_message="scoring raised",
            samples=[],
            reward_components={},
            timings={},
            metrics={},
        )
        if i == 9
        else _rollout(i)
        for i in range(8, 12)
    ]
    with RolloutStoreWriter(path) as w:
        assert w.append(first, step=4) == 8
        assert w.append(second, step=5, kind="eval", off_policy_age=[0, 1, 2, 3]) == 12
    back = read_rollouts(path)
    assert len(back) == 12
    for want, got in zip(first + second, back):
        assert got.samples == want.samples
        assert (got.env, got.task_id, got.example_id, got.group_id) == (
            want.env,
            want.task_id,
            want.example_id,
            want.group_id,
        )
        assert got.reward == pytest.approx(want.reward) and got.advantage == pytest.approx(want.advantage)
        assert (got.error_class, got.error_message) == (want.error_class, want.error_message)
        assert (got.truncated, got.truncation_reason, got.num_turns) == (
            want.truncated,
            want.truncation_reason,
            want.num_turns,
        )
        assert got.reward_components == want.reward_components and got.timings == want.timings
    df = load_rollouts(path)
    assert list(df["step"]) == [4] * 8 + [5] * 4
    assert list(df["kind"].astype(str)) == ["train"] * 8 + ["eval"] * 4
    # off_policy_age defaults to step - policy_version, else the given list
    assert list(df["off_policy_age"]) == [1] * 8 + [0, 1, 2, 3]
    assert list(df["completion_len"][:4]) == [2, 2, 2, 5]
    assert df.loc[9, "error_class"] == "TaskError" and pd.isna(df.loc[8, "error_class"])
    assert np.isnan(df.loc[9, "reward/correct"]) and df.loc[1, "reward/correct"] == 1.0


def test_columns_schema_and_selection(tmp_path: Path) -> None:
    path = tmp_path / "rollouts.h5"
    with RolloutStoreWriter(path) as w:
        w.append([_rollout(i) for i in range(4)], step=0)
        # a component that appears later reads back NaN in earlier rows
        w.append([_rollout(4, reward_components={"format": 0.5})], step=1)
    cols = store_columns(path)
    assert cols[: len(BASE_COLUMNS)] == list(BASE_COLUMNS)
    assert {"reward/correct", "reward/format", "timing/generate", "metric/lcs", "error_message"} <= set(cols)
    df = load_rollouts(path, columns=["step", "reward/format"])
    assert list(df.columns) == ["step", "reward/format"]
    assert df["reward/format"].isna().tolist() == [True] * 4 + [False]
    assert len(load_rollouts(path, kind="eval")) == 0
    with pytest.raises(KeyError, match="nope"):
        load_rollouts(path, columns=["nope"])
    with pytest.raises(FileNotFoundError):
        load_rollouts(tmp_path / "missing.h5")
    tok = load_rollouts(path, columns=["step"], with_tokens=True)
    assert [len(x) for x in tok["completion_ids"]] == [2, 1, 1, 2, 1]
    assert tok["completion_mask"][0][0].dtype == bool and tok["completion_logprobs"][0][0].dtype == np.float32


def test_uncommitted_append_is_ignored_and_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "rollouts.h5"
    with RolloutStoreWriter(path) as w:
        w.append([_rollout(i) for i in range(4)], step=0)
        w.append(
            [_rollout(i, error_class="ProviderError", error_message="down") for i in range(4, 8)], step=1
        )
    # Inject what a writer killed after writing data but before committing num_rows leaves behind.
    with h5py.File(path, "a") as f:
        f.attrs["num_rows"] = 4
    assert len(load_rollouts(path)) == 4
    assert load_rollouts(path)["error_message"].isna().all()
    with RolloutStoreWriter(path) as w:
        w.append([_rollout(i) for i in range(8, 10)], step=2)
    df = load_rollouts(path, with_tokens=True)
    assert list(df["step"]) == [0] * 4 + [2] * 2
    assert df["error_class"].isna().all()
    assert [len(s) for s in df["prompt_ids"]] == [2, 1, 1, 2, 1, 2]
    assert df["prompt_ids"][4][0].tolist() == [1, 2, 8]


def test_killed_writer_keeps_committed_appends(tmp_path: Path) -> None:
    path = tmp_path / "rollouts.h5"
    script = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(ROOT)!r})
        from analysis.store import RolloutStoreWriter
        from toolkit.orchestrator.types import Rollout, TrainingSample
        w = RolloutStoreWriter({str(path)!r})
        for step in range(3):
            w.append([Rollout(env="e", task_id="t", example_id=0, reward=step,
                              samples=[TrainingSample([1], [2], [True], [-0.1])])] * 5, step=step)
        os.kill(os.getpid(), signal.SIGKILL)  # no close, no interpreter shutdown
    """)
    proc = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr
    df = load_rollouts(path)
    assert len(df) == 15 and list(df["reward"][::5]) == [0.0, 1.0, 2.0]


def test_reader_between_appends_of_an_open_writer(tmp_path: Path) -> None:
    path = tmp_path / "rollouts.h5"
    with RolloutStoreWriter(path) as w:
        w.append([_rollout(0)], step=0)
        assert len(load_rollouts(path)) == 1
        w.append([_rollout(1)], step=1)
        assert len(load_rollouts(path)) == 2


def test_bad_off_policy_age_length(tmp_path: Path) -> None:
    with RolloutStoreWriter(tmp_path / "s.h5") as w, pytest.raises(ValueError, match="off_policy_age"):
        w.append([_rollout(0)], step=0, off_policy_age=[1, 2])


def test_counts_attribute_tracks_samples_tokens_and_errors(tmp_path: Path) -> None:
    """``counts`` says where the committed rows' samples, tokens and error entries end; a store written without it
    (an older srl) is still appended to correctly, and gets it from then on."""
    path = tmp_path / "rollouts.h5"
    with RolloutStoreWriter(path) as w:
        w.append([_rollout(i) for i in range(3)], step=0)
        w.append([_rollout(i, error_class="TaskError", error_message="boom") for i in range(3, 5)], step=1)
    with h5py.File(path, "r") as f:
        counts = f.attrs["counts"].tolist()
        assert counts == [5, f["samples"]["row"].shape[0], f["tokens"]["ids"].shape[0], 2]
    with h5py.File(path, "a") as f:  # as an older srl left it
        del f.attrs["counts"]
    with RolloutStoreWriter(path) as w:
        w.append([_rollout(i) for i in range(5, 7)], step=2)
        w.append([_rollout(i, error_class="ProviderError", error_message="down") for i in range(7, 8)], step=3)
    df = load_rollouts(path, with_tokens=True)
    assert list(df["step"]) == [0] * 3 + [1] * 2 + [2] * 2 + [3]
    assert df["error_message"].tolist()[3:5] == ["boom", "boom"] and df["error_message"].tolist()[-1] == "down"
    for row in range(8):  # every row's tokens where they belong, across the append without ``counts``
        want = _rollout(row).samples
        assert [p.tolist() for p in df["prompt_ids"][row]] == [s.prompt_ids for s in want]
        assert [c.tolist() for c in df["completion_ids"][row]] == [s.completion_ids for s in want]
    with h5py.File(path, "r") as f:
        assert f.attrs["counts"].tolist()[0] == 8 and f.attrs["counts"].tolist()[3] == 3


def test_new_categories_from_another_writer_are_seen(tmp_path: Path) -> None:
    """A writer caches its string columns' categories; codes stay right when another writer (an eval run after a
    restart) added categories to the same file in between."""
    path = tmp_path / "rollouts.h5"
    first = RolloutStoreWriter(path)
    first.append([_rollout(0)], step=0, kind="train")
    RolloutStoreWriter(path).append([_rollout(1)], step=0, kind="eval")
    first.append([_rollout(2)], step=1, kind="train")
    first.append([_rollout(3)], step=1, kind="baseline")
    assert load_rollouts(path)["kind"].tolist() == ["train", "eval", "train", "baseline"]
