"""Hostile inputs for the reload's read ahead (``worker_ext._ReadAhead``): it never raises, never hangs the reload
(each case runs in a subprocess with a deadline, so a regression fails instead of stalling the suite) and never
leaves the CPUs the process was given."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from toolkit.inference.worker_ext import _ReadAhead

ROOT = Path(__file__).resolve().parents[2]
needs_affinity = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux CPU affinity")


def _python(code: str, timeout: float = 30) -> str:
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=timeout, check=False
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


# A parent process in an allocation of ``cpus`` starts a vLLM-like worker whose main thread is pinned to the first
# CPU before the extension is imported (in vLLM, libgomp does it at ``import torch`` because OMP_PLACES is set; the
# pin is made directly here: importing torch on one contended core took minutes while the suite ran vLLM there).
_WORKER = """
import os, sys
from pathlib import Path
os.sched_setaffinity(0, {int(os.environ["PIN"])})  # this (main) thread only, as libgomp pins it
from toolkit.inference.worker_ext import _ReadAhead
seen = []
class Probe(_ReadAhead):
    def _run(self):
        super()._run(); seen.append(sorted(os.sched_getaffinity(0)))
a = Probe([Path(sys.argv[1])]); a.join()
print(sorted(os.sched_getaffinity(0)), sorted(a.cpus), seen[0], a.bytes_read)
"""

_TREE = (
    "import os, subprocess, sys\n"
    "os.sched_setaffinity(0, {cpus})  # the allocation: the whole tree, as taskset or a Slurm mask would\n"
    "env = dict(os.environ, PIN='{first}')\n"
    "out = subprocess.run([sys.executable, '-c', {worker!r}, {path!r}], env=env, capture_output=True, text=True)\n"
    "assert out.returncode == 0, out.stderr\n"
    "print(out.stdout.strip())\n"
)


@needs_affinity
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")
def test_a_worker_pinned_by_openmp_reads_ahead_on_the_rest_of_its_allocation(tmp_path):
    (tmp_path / "a.safetensors").write_bytes(b"x" * 5000)
    first, second = sorted(os.sched_getaffinity(0))[:2]
    code = _TREE.format(cpus={first, second}, first=first, worker=_WORKER, path=str(tmp_path / "a.safetensors"))
    assert _python(code, timeout=300) == f"[{first}] [{second}] [{second}] 5000"  # read ahead on the other CPU


@needs_affinity
def test_an_allocation_of_one_cpu_reads_ahead_on_that_cpu_only(tmp_path):
    (tmp_path / "a.safetensors").write_bytes(b"x" * 5000)
    cpu = min(os.sched_getaffinity(0))
    code = _TREE.format(cpus={cpu}, first=cpu, worker=_WORKER, path=str(tmp_path / "a.safetensors"))
    assert _python(code, timeout=300) == f"[{cpu}] [] [{cpu}] 5000"  # nothing to spare: it stays with the worker


@pytest.mark.parametrize("kind", ["directory", "fifo", "dev_zero", "dangling_link"])
def test_files_that_are_not_regular_files_are_skipped_without_blocking(tmp_path, kind):
    odd = tmp_path / "model-00001.safetensors"
    if kind == "directory":
        odd.mkdir()
    elif kind == "fifo":
        os.mkfifo(odd)  # opening it for reading would wait for a writer forever
    elif kind == "dev_zero":
        odd.symlink_to("/dev/zero")  # reading it never ends
    else:
        odd.symlink_to(tmp_path / "nowhere")
    (tmp_path / "model-00002.safetensors").write_bytes(b"y" * 300)
    got = _python(
        "from pathlib import Path\n"
        "from toolkit.inference.worker_ext import _ReadAhead, weight_files\n"
        f"a = _ReadAhead(weight_files({str(tmp_path)!r})); a.join(); print(a.bytes_read)\n",
        timeout=30,
    )
    # A missing file ends the read ahead (vLLM reports it); anything else that is not a file is passed over.
    assert got == ("0" if kind == "dangling_link" else "300")


@pytest.mark.parametrize("fault", ["open", "read"])
def test_a_file_that_cannot_be_read_ends_the_read_ahead_quietly(tmp_path, monkeypatch, fault):
    # Root-proof faults (root reads a mode-000 file anyway): a symlink loop fails the open for every user (ELOOP);
    # an I/O error in the middle of a file (EIO), which no real disk gives on demand, is injected into the read.
    monkeypatch.setattr(_ReadAhead, "CHUNK", 4096)
    bad, after = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    after.write_bytes(b"y" * 4096)
    errors = []
    monkeypatch.setattr(threading, "excepthook", lambda args: errors.append(args.exc_value))
    if fault == "open":
        bad.symlink_to(bad)
    else:
        bad.write_bytes(b"x" * 3 * 4096)
        real, calls = os.readv, []

        def failing_readv(fd, buffers):
            calls.append(fd)
            if len(calls) == 2:
                raise OSError(5, "Input/output error")
            return real(fd, buffers)

        monkeypatch.setattr(os, "readv", failing_readv)
    ahead = _ReadAhead([bad, after])
    ahead.join()
    # The first failure ends the read ahead: nothing raised, and the file after it is not read either.
    assert not errors and ahead.bytes_read == (0 if fault == "open" else 4096)


@pytest.mark.parametrize("fault", ["removed", "truncated"])
def test_a_file_removed_or_truncated_mid_read_never_raises(tmp_path, monkeypatch, fault):
    monkeypatch.setattr(_ReadAhead, "CHUNK", 4096)  # many read calls, so the fault lands during the read
    f = tmp_path / "a.safetensors"
    size = 8 << 20
    f.write_bytes(b"x" * size)
    errors = []
    monkeypatch.setattr(threading, "excepthook", lambda args: errors.append(args.exc_value))
    ahead = _ReadAhead([f, f])
    if fault == "removed":
        f.unlink()  # an open file stays readable; a not yet opened one is gone
    else:
        os.truncate(f, 100)
    ahead.join()
    assert not errors and 0 <= ahead.bytes_read <= 2 * size


def test_no_thread_to_spare_means_no_read_ahead_and_no_error(tmp_path, monkeypatch):
    def refuse(self):
        raise RuntimeError("can't start new thread")  # what a thread or memory limit raises

    (tmp_path / "a.safetensors").write_bytes(b"x" * 10)
    monkeypatch.setattr(threading.Thread, "start", refuse)
    ahead = _ReadAhead([tmp_path / "a.safetensors"])
    ahead.join()
    assert ahead.bytes_read == 0


def test_stop_ends_the_read_ahead_after_the_current_chunk(tmp_path, monkeypatch):
    monkeypatch.setattr(_ReadAhead, "CHUNK", 4096)
    f = tmp_path / "a.safetensors"
    f.write_bytes(b"x" * (64 << 20))
    ahead = _ReadAhead([f, f, f])
    ahead.stop()
    ahead.join()
    assert ahead.bytes_read < 3 * (64 << 20)  # not every byte: stopped part-way (at once, here)
