"""Sweeps of the jobs users run: each point an ``srl rl`` batch job inside an array task of its own shape.

Without Slurm: the split into arrays (one per allocation shape, chunks of at most MaxArraySize, a shared
``max_parallel``), ``srl sweep`` composing like ``srl rl`` (overlays, overrides for every point, ``--site``,
``--output-dir``, ``--dry-run``), refusal of a point the site cannot hold, and a golden render of a GPU-site sweep
(generic-hpc) whose arrays request each point's nodes and GPUs. The real cluster runs in
tests/integration/test_sweep_multinode_slurm.py.
"""

from __future__ import annotations

import difflib
import json
import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolkit.config import ConfigError
from toolkit.launch.sweeps import plan_arrays, render_array
from toolkit.sweep import main

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden"


def _max_running(chunks) -> int:
    """Most tasks that can run at once: every lane runs one chunk at a time, a chunk at most ``throttle`` tasks."""
    lanes: dict[int, int] = {}
    for c in chunks:
        lanes[c.lane] = max(lanes.get(c.lane, 0), min(c.throttle, len(c.points)))
    return sum(lanes.values())


@settings(max_examples=200, deadline=None)
@given(
    shapes=st.lists(st.tuples(st.integers(1, 40), st.booleans()), min_size=1, max_size=6),
    max_parallel=st.integers(1, 12),
    size=st.integers(1, 15),
)
def test_split_never_runs_more_than_max_parallel(shapes, max_parallel, size):
    chunks = plan_arrays(shapes, max_parallel, size)
    # every point exactly once, in shape order, each chunk within one shape and within MaxArraySize
    assert [i for c in chunks for i in c.points] == list(range(sum(n for n, _ in shapes)))
    bounds = [sum(n for n, _ in shapes[:k]) for k in range(len(shapes) + 1)]
    for c in chunks:
        assert bounds[c.shape] <= min(c.points) and max(c.points) < bounds[c.shape + 1]
        assert len(c.points) <= (size if shapes[c.shape][1] else 1)
        assert c.array == shapes[c.shape][1]
    # one chain per lane: each chunk waits for the previous chunk of its lane, and only for it
    for i, c in enumerate(chunks):
        before = [j for j in range(i) if chunks[j].lane == c.lane]
        assert c.after == (before[-1] if before else None)
    assert _max_running(chunks) <= max_parallel
    assert len({c.lane for c in chunks}) == min(max_parallel, len(chunks))


def test_split_examples():
    # 2000 points, MaxArraySize 1001, max_parallel 40: two chunks share the throttle (20 + 20), none waits
    c = plan_arrays([(2000, True)], 40, 1001)
    assert [(len(x.points), x.throttle, x.after) for x in c] == [(1001, 20, None), (999, 20, None)]
    # 1, 3 and 3 nodes: two shapes, max_parallel 1: one lane, the second array behind the first
    c = plan_arrays([(1, True), (2, True)], 1, 1001)
    assert [(x.points, x.throttle, x.after) for x in c] == [([0], 1, None), ([1, 2], 1, 0)]
    # het-group points: one plain job each, chained when max_parallel allows only one
    c = plan_arrays([(3, False)], 2, 1001)
    assert [(x.points, x.array, x.lane, x.after) for x in c] == [
        ([0], False, 0, None),
        ([1], False, 1, None),
        ([2], False, 0, 0),
    ]


def _sweep(tmp_path: Path, body: str, name: str = "s") -> Path:
    f = tmp_path / "sweep.toml"
    f.write_text(f'[sweep]\nname = "{name}"\n' + body)
    return f


def _directives(text: str) -> list[str]:
    return [ln[len("#SBATCH ") :] for ln in text.splitlines() if ln.startswith("#SBATCH ")]


def test_sweep_composes_like_srl_rl(tmp_path: Path, capsys) -> None:
    overlay = tmp_path / "overlay.toml"
    overlay.write_text("[orchestrator]\nbatch_size = 32\n")
    f = _sweep(
        tmp_path,
        f'base = ["{ROOT}/jobs/reverse-text/rl.toml"]\nmax_parallel = 1\n'
        '[sweep.grid]\n"trainer.optim.lr" = [1e-4, 3e-4]\n',
    )
    out = tmp_path / "out"
    assert (
        main(
            [
                "@",
                str(f),
                "@",
                str(overlay),
                "--max-steps",
                "7",
                "--site",
                "local-slurm",
                "--output-dir",
                str(out),
                "--dry-run",
            ]
        )
        == 0
    )
    root = out / "s"
    for pid, lr in (("p000", 1e-4), ("p001", 3e-4)):
        cfg = json.loads((root / pid / "configs" / "latest" / "resolved" / "rl.json").read_text())
        assert (cfg["orchestrator"]["batch_size"], cfg["max_steps"], cfg["site"], cfg["trainer"]["optim"]["lr"]) == (
            32,
            7,
            "local-slurm",
            lr,
        )
        assert (root / pid / "launcher" / "rl.sbatch").exists()
    manifest = json.loads((root / "manifest.json").read_text())
    assert manifest["overlays"] == [str(overlay)] and manifest["overrides"][:2] == ["--max-steps", "7"]
    assert not (root / "arrays.jsonl").exists()  # a dry run submits nothing
    # An override of a swept field is ambiguous: refused naming it, before anything is written.
    with pytest.raises(ConfigError, match="trainer.optim.lr"):
        main(["@", str(f), "--trainer.optim.lr", "1e-3", "--output-dir", str(tmp_path / "o2"), "--dry-run"])
    assert not (tmp_path / "o2").exists()


def test_point_that_does_not_fit_the_site_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    f = _sweep(
        tmp_path,
        f'base = ["{ROOT}/jobs/reverse-text/rl.toml", "{ROOT}/jobs/reverse-text/slurm.toml"]\n'
        '[sweep.grid]\n"deployment.num_train_nodes" = [2, 4]\n',
    )
    with pytest.raises(ConfigError) as e:
        main(["@", str(f), "--output-dir", str(tmp_path / "out")])
    assert "p001" in str(e.value) and "5 nodes" in str(e.value) and "max_nodes" in str(e.value)
    assert not (tmp_path / "out").exists()


# Points of 1, 3 and 3 nodes on the local cluster: a whole deployment table per point (zip), the slurm overlay's
# job settings for all. Also used by tests/integration/test_sweep_multinode_slurm.py.
SHAPES_SWEEP = """base = ["{root}/jobs/reverse-text/rl.toml", "{root}/jobs/reverse-text/slurm.toml"]
max_parallel = 1
[sweep.zip]
"trainer.optim.lr" = [1e-4, 2e-4, 3e-4]
deployment = [{{ type = "single_node", gpus_per_node = 0 }},
              {{ type = "multi_node", gpus_per_node = 0, num_infer_nodes = 1, num_train_nodes = 2 }},
              {{ type = "multi_node", gpus_per_node = 0, num_infer_nodes = 1, num_train_nodes = 2 }}]
"""


def test_local_slurm_sweep_of_1_3_3_nodes_is_split_by_shape(tmp_path: Path) -> None:
    f = _sweep(tmp_path, SHAPES_SWEEP.format(root=ROOT), name="shapes")
    assert main(["@", str(f), "--output-dir", str(tmp_path / "out"), "--dry-run"]) == 0
    root = tmp_path / "out" / "shapes"
    d0 = _directives((root / "array_0.sbatch").read_text())
    d1 = _directives((root / "array_1.sbatch").read_text())
    assert "--nodes=1" in d0 and "--array=0-0%1" in d0
    assert "--nodes=3" in d1 and "--array=0-1%1" in d1
    for d in (d0, d1):
        assert "--requeue" in d and "--signal=B:USR2@120" in d and "--no-requeue" not in d
    assert "srl_points=( p000 )" in (root / "array_0.sbatch").read_text()
    assert "srl_points=( p001 p002 )" in (root / "array_1.sbatch").read_text()


def _golden(name: str, text: str) -> None:
    golden = GOLDEN / name
    if os.environ.get("SRL_UPDATE_GOLDEN") == "1" and (not golden.exists() or golden.read_text() != text):
        golden.write_text(text)
        pytest.fail(f"wrote {golden}; review its diff, then rerun without SRL_UPDATE_GOLDEN")
    assert golden.exists(), f"missing {golden}; run with SRL_UPDATE_GOLDEN=1"
    want = golden.read_text()
    diff = "".join(difflib.unified_diff(want.splitlines(True), text.splitlines(True), str(golden), "rendered"))
    assert text == want, diff


def test_gpu_site_sweep_golden(tmp_path: Path) -> None:
    """generic-hpc (GPUs requested per node, a required account, partitions): a point of 1 inference + 1 trainer
    node and one of 1 + 2, each node 4 GPUs, go into two arrays requesting 2 and 3 nodes with 4 GPUs each."""
    f = _sweep(
        tmp_path,
        f'base = ["{ROOT}/jobs/reverse-text/rl.toml"]\nmax_parallel = 3\n'
        '[sweep.grid]\n"deployment.num_train_nodes" = [1, 2]\n'
        '[config]\nsite = "generic-hpc"\n[config.slurm]\naccount = "proj42"\ntime = "02:00:00"\n'
        '[config.deployment]\ntype = "multi_node"\ngpus_per_node = 4\nnum_infer_nodes = 1\n',
        name="gpu",
    )
    out = tmp_path / "out"
    assert main(["@", str(f), "--output-dir", str(out), "--dry-run"]) == 0
    root = out / "gpu"
    texts = [(root / f"array_{k}.sbatch").read_text() for k in (0, 1)]
    for k, (nodes, pid) in enumerate(((2, "p000"), (3, "p001"))):
        d = _directives(texts[k])
        assert {
            f"--nodes={nodes}",
            "--gpus-per-node=4",
            "--account=proj42",
            "--partition=gpu",
            "--time=02:00:00",
            "--requeue",
            "--array=0-0%1",
        } <= set(d), d  # a throttle never exceeds its array
        point = _directives((root / pid / "launcher" / "rl.sbatch").read_text())
        assert [x for x in point if not x.startswith(("--job-name", "--output", "--error"))] == [
            x for x in d if not x.startswith(("--job-name", "--output", "--error", "--array"))
        ]
        subprocess.run(["bash", "-n", str(root / f"array_{k}.sbatch")], check=True)
        _golden(f"sweep-gpu-array_{k}.sbatch", texts[k].replace(str(tmp_path), "/TMP"))


def test_array_script_runs_its_tasks_point_script_with_hostile_paths(tmp_path: Path) -> None:
    """Task i executes points[i]'s own batch script in the point's directory, its output appended to the point's
    batch log; a root path full of shell syntax reaches bash as one word, and a task without a point exits 2."""
    from toolkit.launch.sweeps import ArrayChunk, PreparedPoint
    from toolkit.run.layout import RunDir

    root = tmp_path / "o;touch${IFS}PWNED;$(touch PWNED2)'q\"|&*"
    pts = []
    for i in range(2):
        run = RunDir(root / f"p00{i}")
        (run.launcher).mkdir(parents=True)
        run.logs.mkdir()
        (run.launcher / "rl.sbatch").write_text(f'echo "point {i} in $PWD job $SLURM_JOB_ID"\n')
        pts.append(PreparedPoint(i, f"p00{i}", run, 1, run.launcher / "rl.sbatch", (("--nodes=1",),), f"p00{i}"))
    text = render_array("s", 0, ArrayChunk(0, [0, 1], True, 1, 0), pts, Path("/x"))
    text = text.replace("srl_root=/x", "srl_root=" + __import__("shlex").quote(str(root)))
    script = tmp_path / "a.sbatch"
    script.write_text(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    for task in ("1", "0"):
        r = subprocess.run(
            ["bash", str(script)],
            env={**env, "SLURM_JOB_ID": "55", "SLURM_ARRAY_TASK_ID": task},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert r.returncode == 0, r.stderr
        assert f"runs sweep point p00{task}" in r.stderr
        log = root / f"p00{task}" / "logs" / f"p00{task}-55.out"
        assert log.read_text() == f"point {task} in {root / f'p00{task}'} job 55\n"
    r = subprocess.run(
        ["bash", str(script)],
        env={**env, "SLURM_JOB_ID": "56", "SLURM_ARRAY_TASK_ID": "2"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert r.returncode == 2 and "no point" in r.stderr
    assert not list(tmp_path.rglob("PWNED*")) and not list(Path.cwd().glob("PWNED*"))


def test_status_and_continue_command_of_a_dry_run_sweep(tmp_path: Path, capsys) -> None:
    from toolkit.launch.control import status_main
    from toolkit.launch.sweeps import _task_indices, continue_command

    f = _sweep(tmp_path, f'base = ["{ROOT}/jobs/reverse-text/rl.toml"]\nseeds = [0, 1]\n')
    argv = ["@", str(f), "--max-steps", "4", "--site", "local-slurm", "--output-dir", str(tmp_path / "o"), "--dry-run"]
    assert main(argv) == 0
    root = tmp_path / "o" / "s"
    capsys.readouterr()
    assert status_main([str(root)]) == 0
    rows = [ln.split("\t") for ln in capsys.readouterr().out.splitlines() if ln.startswith("p00")]
    assert [(r[0], r[1], r[4], r[6]) for r in rows] == [
        ("p000", "NOT SUBMITTED", "-", "- seed=0"),
        ("p001", "NOT SUBMITTED", "-", "- seed=1"),
    ]
    assert (
        continue_command(root) == f"srl sweep @ {f} --max-steps 4 --site local-slurm --output-dir {tmp_path / 'o'} "
        "--resume"
    )
    assert _task_indices("2-5%1") == [2, 3, 4, 5] and _task_indices("1,3-4") == [1, 3, 4] and _task_indices("x") == []


def test_points_with_a_het_group_run_as_plain_jobs(tmp_path: Path) -> None:
    """Slurm has no heterogeneous job arrays: a point whose orchestrator has its own node (het group 1) is one
    plain job with both groups, one per point."""
    f = _sweep(
        tmp_path,
        f'base = ["{ROOT}/jobs/reverse-text/rl.toml", "{ROOT}/jobs/reverse-text/slurm.toml"]\n'
        'max_parallel = 1\n[sweep.grid]\n"trainer.optim.lr" = [1e-4, 3e-4]\n[config.deployment]\n'
        'num_train_nodes = 1\norchestrator = "own_node"\norchestrator_partition = "debug"\n',
    )
    assert main(["@", str(f), "--output-dir", str(tmp_path / "o"), "--dry-run"]) == 0
    root = tmp_path / "o" / "s"
    for k, pid in ((0, "p000"), (1, "p001")):
        text = (root / f"array_{k}.sbatch").read_text()
        d = _directives(text)
        assert d.count("hetjob") == 1 and not any(x.startswith("--array") for x in d), d
        assert d[d.index("hetjob") - 3 :] == [
            "--nodes=2",
            "--ntasks-per-node=1",
            "--partition=debug",
            "hetjob",
            "--nodes=1",
            "--ntasks-per-node=1",
            "--partition=debug",
        ], d
        assert f"srl_points=( {pid} )" in text and f"--output={root}/logs/%x-%j.out" in d
