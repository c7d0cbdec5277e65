"""Each process of a run reads the resolved config once: a local `srl rl` (2 steps, the README's RL job) with an
audit hook in every Python process of the run (a ``sitecustomize`` on PYTHONPATH) that records each open of a
resolved config or site file for reading, by process.

The trainer and the orchestrator read ``resolved/rl.json`` exactly once each; no other process (the launching
``srl rl``, the supervisor, the engine, the env workers) reads it at all: they get what they need from their parent
(the plan, argv, a worker spec).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from prereqs import need_module

ROOT = Path(__file__).resolve().parents[2]
# About a minute and a half on an idle machine; background_half: scripts/test.sh runs it beside the Slurm tests, to
# even out the halves' times.
pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.background_half]

HOOK = """
import os, sys
_LOG = os.environ.get("SRL_TEST_OPEN_LOG")
if _LOG:
    def _hook(event, args):
        if event != "open" or not args or not isinstance(args[0], (str, bytes, os.PathLike)):
            return
        path = os.fsdecode(args[0])
        mode = str(args[1]) if len(args) > 1 and args[1] is not None else "r"
        if path.endswith(("/resolved/rl.json", "/resolved/sft.json", "site.toml")) and "r" in mode and "+" not in mode:
            with open(_LOG, "a") as f:
                f.write(f"{os.getpid()}\\t{' '.join(sys.argv[:3])}\\t{path}\\n")
    sys.addaudithook(_hook)
"""


def test_each_process_of_a_local_run_reads_the_resolved_config_once(tmp_path):
    need_module("torch")
    need_module("vllm")
    hook_dir = tmp_path / "hook"
    hook_dir.mkdir()
    (hook_dir / "sitecustomize.py").write_text(HOOK)
    reads = tmp_path / "reads.tsv"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(hook_dir), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        "SRL_TEST_OPEN_LOG": str(reads),
    }
    out = tmp_path / "srl.out"
    with open(out, "wb") as f:
        r = subprocess.run(
            [sys.executable, "-m", "toolkit.cli", "rl", "@", "jobs/reverse-text/rl.toml", "--max-steps", "2"]
            + ["--orchestrator.eval.interval", "0", "--output-dir", str(tmp_path / "out"), "--run.name", "once"],
            cwd=ROOT,
            env=env,
            stdout=f,
            stderr=subprocess.STDOUT,
            timeout=1200,
            check=False,
        )
    assert r.returncode == 0, out.read_text()[-3000:]
    rows = [line.split("\t") for line in reads.read_text().splitlines()]
    per_process = Counter((pid, argv) for pid, argv, path in rows if path.endswith("rl.json"))
    assert all(n == 1 for n in per_process.values()), per_process
    readers = sorted(argv.split()[1] for _, argv in per_process)
    assert readers == ["orchestrator", "trainer"], per_process
    assert not [row for row in rows if not row[2].endswith("rl.json")], rows  # the local site is built in
