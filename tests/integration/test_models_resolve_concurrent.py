"""Two processes resolving the same alias at once build it once (fcntl lock), and both get a complete model."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from prereqs import need_module

pytestmark = pytest.mark.slow

need_module("torch")

# Each worker signals it is ready, then waits for a go file so both pass the "not built yet" check at about the same
# time, then prints the inode of the directory it was handed and the inode of model.safetensors inside it.
_WORKER = """
import os, sys, time
from pathlib import Path
go = Path(sys.argv[2])
import torch, transformers  # pay the import before the race starts
Path(sys.argv[3]).touch()
while not go.exists():
    time.sleep(0.01)
from toolkit.models import resolve_model
d = resolve_model("tiny-qwen3", cache_dir=Path(sys.argv[1]))
print(d.stat().st_ino, (d / "model.safetensors").stat().st_ino)
"""


def test_concurrent_first_use_builds_once(tmp_path):
    cache, go = tmp_path / "cache", tmp_path / "go"
    ready = [tmp_path / f"ready{i}" for i in range(2)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(cache), str(go), str(r)], stdout=subprocess.PIPE, text=True
        )
        for r in ready
    ]
    deadline = time.monotonic() + 300
    while not all(r.exists() for r in ready) and time.monotonic() < deadline:
        time.sleep(0.1)
    go.touch()
    outs = [p.communicate(timeout=600)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    # Without the lock the second build would replace the first directory: the inodes would differ.
    assert outs[0] == outs[1]
    assert sorted(p.name for p in cache.iterdir()) == [".tiny-qwen3.lock", "tiny-qwen3"]
