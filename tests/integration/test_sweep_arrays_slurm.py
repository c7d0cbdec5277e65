"""Sweep arrays on the real local Slurm cluster (4 nodes), every component replaced by the probe (probe/probe.py):
what is checked is the allocation each array task gets and how many tasks Slurm runs at once.

- a 3-point sweep whose points need 1, 3 and 3 nodes is split by shape into two arrays; each task's point runs on
  as many nodes as its plan has; with ``max_parallel = 2`` squeue (sampled every 0.2 s) never shows more than 2
  tasks of the sweep running (the 1-node array and the 3-node array run side by side, the 3-node points one after
  the other);
- with a tiny MaxArraySize (2), 5 one-node points become 3 arrays; with ``max_parallel = 3`` squeue never shows
  more than 3 running, although the 4 nodes would hold 4 (each chunk with its own ``%3`` would run 4 at once).

Figures (wall time, the most tasks seen running) are printed; run with ``-s``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_rl_sbatch_slurm import _config, _probe_bin, _site_dir

from toolkit.launch import slurm
from toolkit.run.layout import RunDir

pytestmark = [pytest.mark.slow, pytest.mark.slurm, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def probe_site(tmp_path, monkeypatch):
    sites = _site_dir(tmp_path, _probe_bin(tmp_path))
    monkeypatch.setenv("SRL_SITE_CONFIGS", str(sites))
    return sites / "probe-slurm.toml"


def _sweep(tmp_path: Path, name: str, body: str) -> tuple[Path, list[str]]:
    """Run ``srl sweep`` on a sweep of the probe job; returns the sweep root and the submitted job ids."""
    base = _config(tmp_path, "base")
    f = tmp_path / f"{name}.toml"
    f.write_text(f'[sweep]\nname = "{name}"\nbase = ["{base}"]\n{body}')
    proc = subprocess.run(
        [sys.executable, "-m", "toolkit.cli", "sweep", "@", str(f), "--output-dir", str(tmp_path / "out")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ids = proc.stdout.strip().splitlines()[-1].split(":", 1)[1].split(",")
    return tmp_path / "out" / name, [i.strip() for i in ids]


def _watch(root: Path, jobs: list[str], budget_s: float) -> tuple[int, dict[str, str]]:
    """Sample squeue every 0.2 s until every job of the sweep left the queue. Returns the most tasks seen RUNNING
    at once and the last state seen per task (``<array>_<task>``)."""
    most, seen = 0, {}
    deadline = time.monotonic() + budget_s
    pattern = re.compile(r"^(\d+)_(\d+) (\S+)$")
    while True:
        out = subprocess.run(
            ["squeue", "-h", "-r", "-j", ",".join(jobs), "-o", "%i %T"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        ).stdout
        lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
        running = 0
        for ln in lines:
            m = pattern.match(ln)
            if m:
                seen[f"{m.group(1)}_{m.group(2)}"] = m.group(3)
                running += m.group(3) == "RUNNING"
        most = max(most, running)
        if not lines:
            return most, seen
        assert time.monotonic() < deadline, f"sweep still queued after {budget_s} s: {lines}\n{_logs(root)}"
        time.sleep(0.2)


def _logs(root: Path) -> str:
    parts = [f"---- {p}\n{p.read_text(errors='replace')[-2000:]}" for p in sorted(root.glob("**/logs/*.out"))]
    return "\n".join(parts)[-12000:]


def _nodes_of(run: RunDir) -> set[str]:
    return {json.loads(p.read_text())["node"] for p in (run.root / "probe").glob("*.json")}


def _final_states(root: Path) -> dict[str, tuple[str, int | None]]:
    out = {}
    for p in json.loads((root / "manifest.json").read_text())["points"]:
        run = RunDir(Path(p["run_dir"]))
        ((task, _, _),) = [j for j in _read_ids(run)]
        st = slurm.job_state(task)
        out[p["point_id"]] = (st.state, st.exit_code)
    return out


def _read_ids(run: RunDir):
    from toolkit.launch.submit import read_job_ids

    return read_job_ids(run)


def test_points_of_1_3_3_nodes_split_by_shape_within_max_parallel(tmp_path, probe_site, capsys):
    t0 = time.monotonic()
    root, jobs = _sweep(
        tmp_path,
        "shapes",
        """max_parallel = 2
[sweep.zip]
"trainer.optim.lr" = [1e-4, 2e-4, 3e-4]
deployment = [{ type = "single_node", gpus_per_node = 4, num_infer_gpus = 2, num_train_gpus = 2 },
              { type = "multi_node", gpus_per_node = 4, num_infer_nodes = 1, num_train_nodes = 2 },
              { type = "multi_node", gpus_per_node = 4, num_infer_nodes = 1, num_train_nodes = 2 }]
""",
    )
    assert len(jobs) == 2, jobs  # one array per shape
    most, seen = _watch(root, jobs, 400)
    wall = time.monotonic() - t0
    assert most <= 2, most
    assert set(seen) == {f"{jobs[0]}_0", f"{jobs[1]}_0", f"{jobs[1]}_1"}, seen
    states = _final_states(root)
    assert all(s == ("COMPLETED", 0) for s in states.values()), (states, _logs(root))
    for pid, nodes in (("p000", 1), ("p001", 3), ("p002", 3)):
        assert len(_nodes_of(RunDir(root / pid))) == nodes, (pid, _nodes_of(RunDir(root / pid)))
    capsys.readouterr()
    from toolkit.launch.control import status_main

    assert status_main([str(root)]) == 0
    out = capsys.readouterr().out
    for pid, task in (("p000", f"{jobs[0]}_0"), ("p001", f"{jobs[1]}_0"), ("p002", f"{jobs[1]}_1")):
        assert re.search(rf"^{pid}\tCOMPLETED\t.*\t{task}\t0\t", out, re.MULTILINE), out
    with capsys.disabled():
        print(f"\n1/3/3-node sweep: 2 arrays, at most {most} tasks running (max_parallel 2), {wall:.0f} s")


def test_split_arrays_share_max_parallel(tmp_path, probe_site, capsys):
    text = probe_site.read_text().replace("max_array_size = 1001", "max_array_size = 2")
    assert "max_array_size = 2" in text
    probe_site.write_text(text)
    t0 = time.monotonic()
    root, jobs = _sweep(
        tmp_path,
        "chunks",
        """max_parallel = 3
seeds = [0, 1, 2, 3, 4]
[sweep.zip]
deployment = [{ type = "single_node", gpus_per_node = 4, num_infer_gpus = 2, num_train_gpus = 2 }]
""",
    )
    assert len(jobs) == 3, jobs  # 2 + 2 + 1 tasks
    most, seen = _watch(root, jobs, 400)
    wall = time.monotonic() - t0
    assert len(seen) == 5, seen
    assert most <= 3, most
    states = _final_states(root)
    assert all(s == ("COMPLETED", 0) for s in states.values()), (states, _logs(root))
    arrays = [json.loads(ln) for ln in (root / "arrays.jsonl").read_text().splitlines()]
    assert sum(a["throttle"] for a in arrays if a["after"] is None) == 3, arrays
    with capsys.disabled():
        print(
            f"\n5 points, MaxArraySize 2: {len(jobs)} arrays, at most {most} tasks running (max_parallel 3), "
            f"{wall:.0f} s"
        )


def test_srl_cancel_of_a_sweep_checkpoints_running_points_and_prints_how_to_continue(tmp_path, probe_site, capsys):
    """Two 3-node points, one at a time: while p000 runs (its probe trainer would run 120 s), ``srl cancel <sweep>``
    removes the pending p001, asks p000 to checkpoint and stop (the probe trainer writes its checkpoint marker when
    it sees the stop request) and prints the ``srl sweep ... --resume`` that continues the sweep."""
    from toolkit.launch.control import cancel_main, status_main

    base = _config(tmp_path, "base")
    f = tmp_path / "c.toml"
    f.write_text(
        f'[sweep]\nname = "cx"\nbase = ["{base}"]\nmax_parallel = 1\n[sweep.grid]\n"trainer.optim.lr" = [1e-4, 2e-4]\n'
    )
    argv = ["sweep", "@", str(f), "--output-dir", str(tmp_path / "out")]
    # A dry run writes the points; the probe trainer reads how long to run from each, then the sweep is submitted
    # with --resume (continuing the dry-run points).
    for extra in (["--dry-run"], ["--resume"]):
        proc = subprocess.run(
            [sys.executable, "-m", "toolkit.cli", *argv, *extra],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        if extra == ["--dry-run"]:
            for pid in ("p000", "p001"):
                (tmp_path / "out" / "cx" / pid / "probe").mkdir()
                (tmp_path / "out" / "cx" / pid / "probe" / "trainer_seconds").write_text("120")
    root = tmp_path / "out" / "cx"
    p0, p1 = RunDir(root / "p000"), RunDir(root / "p001")
    deadline = time.monotonic() + 120
    while not any((p0.root / "probe").glob("trainer@*.json")):
        assert time.monotonic() < deadline, _logs(root)
        time.sleep(0.2)
    capsys.readouterr()
    t0 = time.monotonic()
    assert cancel_main([str(root), "--grace", "60"]) == 0
    took = time.monotonic() - t0
    out = capsys.readouterr().out
    assert "p000" in out and "asked to checkpoint and stop" in out, out
    assert f"srl sweep @ {f} --output-dir {tmp_path / 'out'} --resume" in out, out
    assert (p0.checkpoints / "step_1" / "COMPLETE").exists()  # the probe trainer's checkpoint on the stop request
    assert not any((p1.root / "probe").glob("*@*.json"))  # the pending point never started
    ((task0, _, _),) = _read_ids(p0)[-1:]
    # Ended by its stop request within the grace period, not killed by the cancel: the job's exit status is the
    # run's ending (a user's stop), not Slurm's CANCELLED.
    st0 = slurm.job_state(task0)
    assert st0.state in ("COMPLETED", "FAILED") and st0.signal == 0, st0
    assert status_main([str(root)]) == 0
    rows = {ln.split("\t")[0]: ln.split("\t") for ln in capsys.readouterr().out.splitlines() if ln.startswith("p00")}
    assert rows["p000"][1] == st0.state and rows["p001"][1] == "CANCELLED", rows
    with capsys.disabled():
        print(f"\nsrl cancel of a sweep: running point checkpointed and stopped, pending point cancelled, {took:.0f} s")
