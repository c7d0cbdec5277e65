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

from toolkit.run.store import BASE_COLUMNS, RolloutStoreWriter, load_rollouts
from toolkit.run.types import Rollout, TrainingSample

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


def _none(value):
    return None if pd.isna(value) else value


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
    back = load_rollouts(path, with_tokens=True)
    assert len(back) == 12
    for want, (_, got) in zip(first + second, back.iterrows()):
        samples = zip(got.prompt_ids, got.completion_ids, got.completion_mask, got.completion_logprobs)
        assert [TrainingSample(*(a.tolist() for a in s)) for s in samples] == want.samples
        assert (got.env, got.task_id, got.example_id, got.group_id) == (
            want.env,
            want.task_id,
            want.example_id,
            want.group_id,
        )
        assert got.reward == pytest.approx(want.reward) and got.advantage == pytest.approx(want.advantage)
        assert (_none(got.error_class), got.error_message) == (want.error_class, want.error_message)
        assert (got.truncated, _none(got.truncation_reason), got.num_turns) == (
            want.truncated,
            want.truncation_reason,
            want.num_turns,
        )
        components = {c.removeprefix("reward/"): v for c, v in got.items() if c.startswith("reward/")}
        timings = {c.removeprefix("timing/"): v for c, v in got.items() if c.startswith("timing/")}
        assert {k: v for k, v in components.items() if not np.isnan(v)} == want.reward_components
        assert {k: v for k, v in timings.items() if not np.isnan(v)} == want.timings
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
    cols = list(load_rollouts(path).columns)
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
        w.append([_rollout(i, error_class="ProviderError", error_message="down") for i in range(4, 8)], step=1)
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
        from toolkit.run.store import RolloutStoreWriter
        from toolkit.run.types import Rollout, TrainingSample
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


# -- the low-level append (h5d.open / set_extent / hyperslab write) against the high-level write it replaced ------


def _high_level_append(group: h5py.Group, name: str, start: int, values) -> None:
    """The append as it was before the low-level API (``git show 8359665~1:analysis/store.py``): the reference
    the fast path must match byte for byte."""
    ds = group[name]
    ds.resize((start + len(values),))
    if len(values):
        ds[start : start + len(values)] = values


def _retype(path: Path, changes: dict[str, type]) -> None:
    """Recreate datasets with another dtype and the same rows, chunks and fill: a store another srl version (or a
    hand-made tool) wrote with types that differ from the values this writer appends."""
    with h5py.File(path, "a") as f:
        for name, dtype in changes.items():
            old = f[name]
            data, attrs, chunks = old[()], dict(old.attrs), old.chunks
            del f[name]
            new = f.create_dataset(name, data=data.astype(dtype), maxshape=(None,), chunks=chunks)
            new.attrs.update(attrs)


_RETYPED = {
    "columns/truncated": np.uint8,
    "columns/example_id": np.int32,
    "columns/reward": np.float32,
    "columns/kind": np.int64,  # categorical codes wider than int32
    "tokens/ids": np.int64,
    "tokens/logprobs": np.float64,
    "tokens/mask": np.bool_,
}


def _write_scenario(path: Path, retype: bool) -> None:
    """Appends that exercise every column type: bool, categorical codes with None, int64, float64 with NaN (a
    dynamic column absent from some rows), float32 logprobs, uint8 mask; an append whose rollouts have no samples
    (zero tokens), a torn append overwritten by the next one, and an append of nothing."""
    with RolloutStoreWriter(path) as w:
        w.append([_rollout(i) for i in range(6)], step=0)
    if retype:
        _retype(path, _RETYPED)
    with RolloutStoreWriter(path) as w:
        w.append([_rollout(i, samples=[], metrics={}) for i in range(6, 9)], step=1, kind="eval")
        w.append(
            [
                _rollout(
                    i, error_class="TaskError", error_message="x" * i, reward=np.nan, reward_components={"late": -0.0}
                )
                for i in range(9, 13)
            ],
            step=2,
        )
    with h5py.File(path, "a") as f:  # the step-2 append died before committing num_rows
        f.attrs["num_rows"] = 9
    with RolloutStoreWriter(path) as w:
        w.append([_rollout(i, truncated=bool(i % 2)) for i in range(13, 15)], step=3)
        w.append([], step=4)
        w.append([_rollout(15, samples=[TrainingSample([], [], [], [])])], step=5)


def _dump(path: Path) -> dict[str, object]:
    """Every dataset's dtype, shape and raw bytes (vlen strings as values), plus the commit attributes; the
    ``time`` column (the clock at each append) is left out."""
    out: dict[str, object] = {}
    with h5py.File(path, "r") as f:

        def visit(name: str, obj: object) -> None:
            if isinstance(obj, h5py.Dataset) and name != "columns/time":
                data = obj[()]
                out[name] = (obj.dtype.str, obj.shape, data.tolist() if obj.dtype.kind == "O" else data.tobytes())

        f.visititems(visit)
        out["@attrs"] = (int(f.attrs["num_rows"]), f.attrs["counts"].tolist())
    return out


@pytest.mark.parametrize("retype", [False, True], ids=["store-dtypes", "other-dtypes"])
def test_low_level_append_writes_the_same_bytes_as_the_high_level_write(tmp_path, monkeypatch, retype) -> None:
    from toolkit.run import store

    _write_scenario(tmp_path / "fast.h5", retype)
    monkeypatch.setattr(store, "_append", _high_level_append)
    _write_scenario(tmp_path / "reference.h5", retype)
    monkeypatch.undo()
    fast, ref = _dump(tmp_path / "fast.h5"), _dump(tmp_path / "reference.h5")
    assert sorted(fast) == sorted(ref)
    for name in ref:
        assert fast[name] == ref[name], name
    if retype:
        assert fast["tokens/mask"][0] == "|b1" and fast["columns/kind"][0] == "<i8"


@pytest.mark.parametrize("retype", [False, True], ids=["store-dtypes", "other-dtypes"])
def test_every_column_type_reads_back_exactly(tmp_path, retype) -> None:
    path = tmp_path / "rollouts.h5"
    _write_scenario(path, retype)
    want = (
        [_rollout(i) for i in range(6)]
        + [_rollout(i, samples=[], metrics={}) for i in range(6, 9)]
        + [_rollout(i, truncated=bool(i % 2)) for i in range(13, 15)]
        + [_rollout(15, samples=[TrainingSample([], [], [], [])])]
    )
    df = load_rollouts(path, with_tokens=True)
    assert len(df) == len(want) == 12
    assert df["step"].tolist() == [0] * 6 + [1] * 3 + [3] * 2 + [5]
    assert df["kind"].astype(str).tolist() == ["train"] * 6 + ["eval"] * 3 + ["train"] * 3
    assert df["truncated"].astype(bool).tolist() == [r.truncated for r in want]
    assert df["truncation_reason"].tolist()[5] == "max_tokens" and pd.isna(df["truncation_reason"][0])
    assert df["error_class"].isna().all() and df["error_message"].isna().all()  # the torn append's are gone
    assert df["example_id"].tolist() == [r.example_id for r in want]
    assert df["reward"].tolist() == [np.float32(r.reward) if retype else r.reward for r in want]
    # "reward/late" was created by the torn append only: NaN everywhere it was not written
    assert df["reward/late"].isna().all()
    assert df["metric/lcs"].isna().tolist() == [False] * 6 + [True] * 3 + [False] * 3
    for row, r in enumerate(want):
        assert [p.tolist() for p in df["prompt_ids"][row]] == [s.prompt_ids for s in r.samples]
        assert [c.tolist() for c in df["completion_ids"][row]] == [s.completion_ids for s in r.samples]
        assert [m.tolist() for m in df["completion_mask"][row]] == [s.completion_mask for s in r.samples]
        lps = [lp.tolist() for lp in df["completion_logprobs"][row]]
        assert lps == [np.asarray(s.completion_logprobs, np.float32).tolist() for s in r.samples]
    with h5py.File(path, "r") as f:  # nothing of the torn append is left beyond the committed rows
        assert f["columns"]["step"].shape == (12,) and f["errors"]["row"].shape == (0,)
        assert f["tokens"]["ids"].shape[0] == int(f.attrs["counts"][2])


def test_append_converts_a_list_to_the_dataset_type_as_the_high_level_write(tmp_path: Path) -> None:
    from toolkit.run.store import _append

    with h5py.File(tmp_path / "s.h5", "w") as f:
        for name, dtype in (("codes", np.int32), ("ints", np.int64), ("flags", np.bool_), ("lp", np.float32)):
            f.create_dataset(name, shape=(1,), maxshape=(None,), dtype=dtype, chunks=(4,), fillvalue=0)
        _append(f, "codes", 1, [3, -1, 2**31 - 1])  # python ints into int32 categorical codes
        _append(f, "flags", 1, [True, 0, 2.5])
        _append(f, "lp", 1, [-0.1, float("nan")])
        _append(f, "ints", 1, [])
        assert f["codes"][:].tolist() == [0, 3, -1, 2**31 - 1] and f["codes"].dtype == np.int32
        assert f["flags"][:].tolist() == [False, True, False, True]
        assert f["lp"][1] == np.float32(-0.1) and np.isnan(f["lp"][2])
        assert f["ints"].shape == (1,)
        # NaN cannot be an integer: refused, and the column keeps its length (HDF5 itself would write INT64_MIN)
        with pytest.raises(ValueError):
            _append(f, "ints", 1, [1.0, float("nan")])
        assert f["ints"].shape == (1,)


@pytest.mark.parametrize("shape", [(3, 0), (3, 2)])
def test_append_refuses_values_that_are_not_one_dimensional(tmp_path: Path, shape) -> None:
    from toolkit.run.store import _append

    with h5py.File(tmp_path / "s.h5", "w") as f:
        f.create_dataset("ids", shape=(0,), maxshape=(None,), dtype=np.int32, chunks=(4,))
        with pytest.raises(ValueError, match="shape"):
            _append(f, "ids", 0, np.ones(shape, np.int32))
        assert f["ids"].shape == (0,)


def test_a_damaged_store_fails_at_once_and_a_locked_one_is_waited_for(tmp_path, monkeypatch):
    """Only HDF5's file-lock error is retried: a truncated file's message ("sblock->base_addr") once matched a bare
    "lock" and every open of a damaged store waited out the retries."""
    from toolkit.run import store as store_mod

    damaged = tmp_path / "damaged.h5"
    with h5py.File(damaged, "w") as f:
        f["x"] = list(range(1000))
    damaged.write_bytes(damaged.read_bytes()[:1000])
    sleeps: list[float] = []
    monkeypatch.setattr(store_mod.time, "sleep", sleeps.append)
    with pytest.raises(OSError, match="truncated"):
        store_mod._open(damaged, "r")
    assert sleeps == []
    monkeypatch.undo()

    locked = tmp_path / "locked.h5"
    h5py.File(locked, "w").close()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import h5py, sys, time\n"
                f"f = h5py.File({str(locked)!r}, 'a', locking=True)\n"
                "print('held', flush=True)\n"
                "time.sleep(1.0)\n"
                "f.close()\n"
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with store_mod._open(locked, "r") as f:  # retried until the holder lets go
            assert f is not None
    finally:
        holder.wait(timeout=30)


def test_seat_column_and_a_store_from_before_it_keeps_growing(tmp_path: Path) -> None:
    path = tmp_path / "rollouts.h5"
    with RolloutStoreWriter(path) as w:
        w.append([_rollout(0), _rollout(1)], step=1)
    # A store written by an srl without the seat column: remove it as that srl never wrote it.
    with h5py.File(path, "a") as f:
        del f["columns"]["seat"]
        del f["categories"]["seat"]
    assert "seat" not in load_rollouts(path).columns
    with RolloutStoreWriter(path) as w:  # a resumed run appends to it
        w.append([_rollout(2, seat="left"), _rollout(3, seat="right"), _rollout(4)], step=2)
    df = load_rollouts(path)
    assert len(df) == 5 and df["step"].tolist() == [1, 1, 2, 2, 2]
    assert [_none(s) for s in df["seat"]] == [None, None, "left", "right", None]
    assert df["reward"].tolist() == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4])


def _killed_while_open(path: Path, libver: str | None) -> None:
    """A process that opens the store for writing as the given HDF5 format does and is SIGKILLed before closing."""
    opts = f"libver={libver!r}, " if libver else ""
    script = (
        "import os, signal, h5py\n"
        f"f = h5py.File({str(path)!r}, 'a', {opts}locking='best-effort')\n"
        "f.attrs['probe'] = 1\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr


def test_a_writer_killed_with_the_file_open_leaves_a_store_the_next_writer_extends(tmp_path: Path) -> None:
    """Field failure (chaos run, attempt 2): the orchestrator died on "file is already open for write/SWMR write"
    because the store used HDF5's newest format, whose open-for-write mark a killed writer leaves set."""
    path = tmp_path / "rollouts.h5"
    with RolloutStoreWriter(path) as w:
        w.append([_rollout(i) for i in range(4)], step=0)
    _killed_while_open(path, None)
    assert len(load_rollouts(path)) == 4  # readers still open it
    with RolloutStoreWriter(path) as w:
        w.append([_rollout(i) for i in range(4, 6)], step=1)
    assert list(load_rollouts(path)["step"]) == [0] * 4 + [1] * 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rollouts.h5"]


def test_a_store_left_marked_open_by_an_older_writer_is_set_aside_and_a_new_one_started(tmp_path, caplog):
    from toolkit.run import store as store_mod

    path = tmp_path / "rollouts.h5"
    with h5py.File(path, "w", libver="latest") as f:  # what srl wrote before it used the default format
        f.attrs["schema_version"] = store_mod.SCHEMA_VERSION
    _killed_while_open(path, "latest")
    with pytest.raises(OSError, match=r"killed mid-append.*h5clear -s"):
        load_rollouts(path)
    with caplog.at_level("WARNING"), RolloutStoreWriter(path) as w:
        w.append([_rollout(0)], step=7)
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("rollouts.h5.unreadable-")]
    assert len(aside) == 1 and aside[0].name in caplog.text
    assert list(load_rollouts(path)["step"]) == [7]


def test_a_store_that_cannot_be_written_is_not_set_aside(tmp_path: Path, monkeypatch) -> None:
    """Only a file HDF5 cannot open even read-only is replaced: a failure to open for writing alone is raised."""
    from toolkit.run import store as store_mod

    path = tmp_path / "rollouts.h5"
    with RolloutStoreWriter(path) as w:
        w.append([_rollout(0)], step=0)
    real_open = store_mod._open

    def no_write(p, mode):
        if mode != "r":
            raise OSError("Unable to synchronously open file (No space left on device)")
        return real_open(p, mode)

    monkeypatch.setattr(store_mod, "_open", no_write)
    with pytest.raises(OSError, match="No space left"):
        RolloutStoreWriter(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rollouts.h5"]
