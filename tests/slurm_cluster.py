"""The real local Slurm cluster that srl's integration tests submit to.

``.ci/setup-slurm.sh`` installs Debian's slurm-wlm and runs slurmctld plus four ``slurmd -N nodeN`` on
127.0.0.1 (2 cores, 4000 MB, 4 fake GPUs each; partitions ``debug`` and ``preemptible``, a lower tier whose
jobs a debug job needing their cores requeues). :class:`LocalSlurmCluster` wraps that
script for the session fixture ``slurm_cluster`` in ``tests/conftest.py``: it starts the cluster only if it is
not already up and stops it at the end only if it started it, so a developer's long-lived cluster survives a
test run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from toolkit.launch import slurm

REPO = Path(__file__).resolve().parents[1]
SETUP_SCRIPT = REPO / ".ci" / "setup-slurm.sh"
NODE_NAMES = ("node1", "node2", "node3", "node4")
LEASE_DIR = Path("/run/slurm/srl-test-leases")
GPUS_PER_NODE = 4
CPUS_PER_NODE = 2


def submit_sleeper(*sbatch_args: str, job_name: str) -> str:
    """Submit a job that only holds its resources (``sleep 3600``; the caller cancels it) with ``sbatch_args``
    (its shape: nodes, cores, partition, time limit); returns its job id. Raises CalledProcessError when sbatch
    refuses it."""
    out = subprocess.run(
        [
            "sbatch",
            "--parsable",
            *sbatch_args,
            f"--job-name={job_name}",
            "--output=/dev/null",  # not a slurm-<id>.out in the directory the tests run from
            "--wrap",
            "sleep 3600",
        ],
        capture_output=True,
        text=True,
        check=True,
        env=slurm.scrubbed_env(),
    )
    return out.stdout.strip().split(";")[0]


# setup-slurm.sh exits 3 when it cannot install Slurm (not root, no apt-get, apt failed, installed but not on
# PATH): the only reason to skip (and, under CI, the reason named when the run fails: tests/prereqs.py).
_EXIT_CANNOT_INSTALL = 3


class ClusterUnavailable(RuntimeError):
    """Slurm cannot be installed or reached from here (its commands are not on PATH); tests that need it are
    skipped on a developer's machine and fail under CI (tests/prereqs.py)."""


class LocalSlurmCluster:
    """Handle on the 4-node local cluster. All waits are bounded; errors carry the script's output."""

    def __init__(self, script: Path = SETUP_SCRIPT) -> None:
        self.script = script
        self.started_here = False
        self.cold_start_s: float | None = None
        self._leased = False

    def _script(self, action: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(self.script), action],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=slurm.scrubbed_env(),
            check=False,
        )

    def is_up(self) -> bool:
        """True when slurmctld answers and all four slurmd respond (``setup-slurm.sh status``)."""
        if shutil.which("scontrol") is None:
            return False
        return self._script("status", 30).returncode == 0

    def start(self, timeout_s: float = 300) -> None:
        """Bring the cluster up unless it already is; records ``started_here`` and ``cold_start_s`` (seconds).

        Raises ClusterUnavailable when Slurm cannot be installed or ``sbatch`` is not on PATH, RuntimeError (with
        the script's stderr) for any other failure, subprocess.TimeoutExpired after ``timeout_s`` seconds.
        """
        if self.is_up():
            self._check_client()
            return
        t0 = time.monotonic()
        proc = self._script("start", timeout_s)
        if proc.returncode == _EXIT_CANNOT_INSTALL:
            raise ClusterUnavailable(f"cannot install Slurm here ({self.script} start): {proc.stderr.strip()}")
        if proc.returncode != 0:
            raise RuntimeError(f"{self.script} start failed (exit {proc.returncode}):\n{proc.stderr}{proc.stdout}")
        self.started_here = True
        self.cold_start_s = time.monotonic() - t0
        self._check_client()

    @staticmethod
    def _check_client() -> None:
        # Tests submit with the sbatch on PATH; without it every one of them would fail on FileNotFoundError.
        if shutil.which("sbatch") is None:
            raise ClusterUnavailable(f"sbatch is not on PATH ({os.environ.get('PATH', '')})")

    def stop(self, timeout_s: float = 120) -> None:
        """Cancel all jobs and stop the daemons. Raises RuntimeError with the script's stderr on failure."""
        proc = self._script("stop", timeout_s)
        if proc.returncode != 0:
            raise RuntimeError(f"{self.script} stop failed (exit {proc.returncode}):\n{proc.stderr}")

    # ---- sharing between concurrent pytest sessions ------------------------------------------------------
    # Several sessions (helpers, CI shards) may use the one cluster at once. Each holds a lease file named by
    # its pid; the session that started the cluster leaves an OWNED marker, and whoever releases last while
    # that marker exists stops the cluster. A cluster that was up before any session has no marker, so tests
    # never stop it.

    @contextlib.contextmanager
    def _lease_lock(self) -> Iterator[None]:
        LEASE_DIR.mkdir(parents=True, exist_ok=True)
        with open(LEASE_DIR / ".lock", "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    @staticmethod
    def _live_leases() -> list[Path]:
        live = []
        for p in LEASE_DIR.glob("lease-*"):
            pid = int(p.name.split("-", 1)[1])
            try:
                os.kill(pid, 0)
                live.append(p)
            except ProcessLookupError:
                p.unlink(missing_ok=True)  # a crashed session's lease
            except PermissionError:
                live.append(p)
        return live

    def acquire(self, timeout_s: float = 300) -> None:
        """Start the cluster if needed (see :meth:`start`) and register this process as a user of it.

        Without permission to write the lease directory, behaves like :meth:`start`.
        """
        try:
            LEASE_DIR.mkdir(parents=True, exist_ok=True)
        except PermissionError:
            pass
        if not os.access(LEASE_DIR, os.W_OK):
            self.start(timeout_s)
            return
        with self._lease_lock():
            self.start(timeout_s)
            if self.started_here:
                (LEASE_DIR / "OWNED").touch()
            (LEASE_DIR / f"lease-{os.getpid()}").touch()
            self._leased = True

    def release(self) -> None:
        """Drop this process's lease; stop the cluster if a session started it and no other session uses it.

        Without leases (see :meth:`acquire`), stops the cluster only if this object started it.
        """
        if not self._leased:
            if self.started_here:
                self.stop()
            return
        with self._lease_lock():
            (LEASE_DIR / f"lease-{os.getpid()}").unlink(missing_ok=True)
            self._leased = False
            if (LEASE_DIR / "OWNED").exists() and not self._live_leases():
                self.stop()
                (LEASE_DIR / "OWNED").unlink(missing_ok=True)

    def nodes(self) -> list[dict[str, Any]]:
        """One dict per node, sorted by name.

        Keys: ``name``, ``state`` (sinfo short state: ``idle``, ``mix``, ...), ``cpus``, ``memory_mb``,
        ``gres`` (e.g. ``gpu:4``). Raises RuntimeError naming the sinfo command if it fails.
        """
        cmd = ["sinfo", "-h", "-N", "-o", "%N|%t|%c|%m|%G"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"`{' '.join(cmd)}` failed: {proc.stderr.strip()}")
        seen: dict[str, dict[str, Any]] = {}
        for line in proc.stdout.splitlines():
            name, state, cpus, mem, gres = line.strip().split("|")
            seen[name] = {
                "name": name,
                "state": state,
                "cpus": int(cpus),
                "memory_mb": int(mem),
                "gres": gres,
            }
        return [seen[n] for n in sorted(seen)]

    def wait_job(self, job_id: str, timeout_s: float) -> dict[str, Any]:
        """Poll until the job is final (COMPLETED, FAILED, CANCELLED, ...); return its state as a dict.

        The dict is ``dataclasses.asdict`` of :class:`toolkit.launch.slurm.JobState` (keys ``job_id``,
        ``state``, ``exit_code``, ``signal``, ``restart_count``, ``node_list``, ...). Raises TimeoutError
        after ``timeout_s`` seconds.
        """
        return dataclasses.asdict(slurm.wait(job_id, timeout_s=timeout_s))

    def submit_text(
        self, workdir: Path, text: str, *, name: str = "job.sbatch", extra_args: tuple[str, ...] = ()
    ) -> str:
        """Write ``text`` as ``workdir/name`` and submit it from ``workdir``; return the job id."""
        path = Path(workdir) / name
        path.write_text(text)
        os.chmod(path, 0o755)
        return slurm.submit(path, extra_args=extra_args, cwd=workdir)
