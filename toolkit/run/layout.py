"""Every path of a run directory, in one place.

A run lives under ``<output_dir>/<run.name>/`` on the shared filesystem::

    configs/attempt_<n>/{command.txt, inputs/, resolved/rl.json (sft.json for an SFT run), gate.json (a gate job)}
    configs/latest -> attempt_<n>
    launcher/            placement.json, ports.json, rendered sbatch scripts, job ids,
                         admin_token (0600; inference-only deployments),
                         lease.json (who supervises the run now) + lease_history.jsonl (takeovers),
                         stall_restarts.jsonl (stalls that requeued the batch job: monitors.stall_restarts),
                         policy_owner.json (a deployment: the run whose weights it serves)
                         lora_tenants/<run id>.json (a deployment: the runs whose adapters it serves)
    logs/attempt_<n>/    <role>.log ; logs/latest -> attempt_<n>
    rollouts/step_<n>/   one training batch written by the orchestrator (READY marker last)
    broadcasts/step_<n>/ HF safetensors policy weights written by the trainer (STABLE marker last)
    checkpoints/step_<n>/{trainer/, orchestrator/, COMPLETE}   (an SFT run: {trainer/, hf/, COMPLETE})
    model/               an SFT run's final weights as a Hugging Face directory (what ``model.name`` may name)
    data_order.jsonl     an SFT run's sample ids per step (resume checks: each step trains the same samples)
    store/rollouts.h5    every rollout (schema, writer and readers in store.py)
    control/             STOP request file, inference readiness files
    progress/<key>.json  each trainer rank's and the orchestrator's progress record (toolkit.run.heartbeat)
    reports/             offline reports, the first-run gate's verdicts
    eval/<command>/      the first-run gate's Slurm job (``srl eval validate|run``): a run directory of its own
    metrics.jsonl        one JSON object per line: step, time, role, metrics
    policy_reloads.jsonl one JSON object per live weight reload: version, time, each engine's reported version
    run_meta.json        run id, created time; kept across attempts and requeues
    wandb/               ``[monitors.wandb]``: W&B's own files (``offline-run-*`` per attempt), the mirror's cursor
    ending.json          how the latest attempt ended (``toolkit.run.ending``); absent while it runs

Nothing else in srl builds these paths by hand: roles and offline tools take a ``RunDir``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

_STEP_RE = re.compile(r"^step_(\d+)$")
_ATTEMPT_RE = re.compile(r"^attempt_(\d+)$")
_REPLICA_RE = re.compile(r"^replica-(\d+)$")

# Markers written last into a step directory: a reader trusts the directory only once its marker exists.
STABLE_MARKER = "STABLE"
"""A complete weight broadcast (``broadcasts/step_<n>/``)."""
COMPLETE_MARKER = "COMPLETE"
"""A complete checkpoint (``checkpoints/step_<n>/``: every part of the run written)."""


class _Under:
    """A fixed path below the run's root, read as an attribute of :class:`RunDir` (``run.metrics``)."""

    def __init__(self, *parts: str) -> None:
        self.parts = parts

    def __get__(self, run: RunDir, owner: type) -> Path:
        return run.root.joinpath(*self.parts)


@dataclass(frozen=True)
class RunDir:
    """Paths of one run directory. ``root`` is ``<output_dir>/<run.name>`` (absolute)."""

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root).absolute())

    # -- configs -------------------------------------------------------------------------------
    configs = _Under("configs")
    latest_configs = _Under("configs", "latest")

    def config_attempt(self, n: int) -> Path:
        return self.configs / f"attempt_{n}"

    def resolved(self, name: str = "rl", attempt: int | None = None) -> Path:
        """Resolved JSON config ``name`` (rl, trainer, orchestrator, inference) of an attempt (default latest)."""
        base = self.latest_configs if attempt is None else self.config_attempt(attempt)
        return base / "resolved" / f"{name}.json"

    def run_config(self) -> Path:
        """The run's own latest resolved config: ``sft.json`` for an SFT run, else ``rl.json`` (which an SFT run
        does not have). What decides, everywhere, whether a run is an SFT run."""
        sft = self.resolved("sft")
        return sft if sft.is_file() else self.resolved("rl")

    # -- launcher and logs --------------------------------------------------------------------
    launcher = _Under("launcher")
    placement_file = _Under("launcher", "placement.json")
    ports_file = _Under("launcher", "ports.json")
    job_ids_file = _Under("launcher", "job_ids.txt")
    # Written by the local launcher when an attempt starts and when it exits (toolkit.run.launcher).
    local_record = _Under("launcher", "local.json")
    # Mode-0600 file with an inference-only deployment's admin token (toolkit.engines.admin_token): the one place
    # a token is written, so RL runs using the deployment as inference.external can reload it.
    admin_token_file = _Under("launcher", "admin_token")
    # The run lease: the one supervisor allowed to run the run's processes now (toolkit.lease).
    lease_file = _Under("launcher", "lease.json")
    # An inference deployment's policy-owner lease: the one run whose weights it serves (toolkit.lease).
    policy_owner_file = _Under("launcher", "policy_owner.json")
    # An inference deployment's LoRA-tenant leases, one <run id>.json per run whose adapter it serves (toolkit.lease).
    lora_tenants = _Under("launcher", "lora_tenants")
    # JSON lines appended by toolkit.lease whenever a lease is taken over from a dead holder.
    lease_history = _Under("launcher", "lease_history.jsonl")
    # One line per stall that requeued the batch job (toolkit.launch.supervisor), counted against stall_restarts.
    stall_restarts = _Under("launcher", "stall_restarts.jsonl")
    logs = _Under("logs")
    latest_logs = _Under("logs", "latest")

    def log_attempt(self, n: int) -> Path:
        return self.logs / f"attempt_{n}"

    # -- data plane ----------------------------------------------------------------------------
    rollouts = _Under("rollouts")
    broadcasts = _Under("broadcasts")
    checkpoints = _Under("checkpoints")
    store = _Under("store")
    rollout_store = _Under("store", "rollouts.h5")
    reports = _Under("reports")
    metrics = _Under("metrics.jsonl")
    # JSON lines appended by the orchestrator after each live weight reload (see orchestrator/policy.py).
    policy_reloads = _Under("policy_reloads.jsonl")
    run_meta = _Under("run_meta.json")
    # How the latest attempt ended, written and read only through toolkit.run.ending.
    ending = _Under("ending.json")
    # W&B's directory of the run (toolkit.trainer.wandb_mirror): one offline-run-* per attempt.
    wandb = _Under("wandb")
    # An SFT run's final weights (HF directory, written atomically at the end); model.name may name the run
    # directory itself (toolkit.models.resolve_model looks here).
    model_export = _Under("model")
    # JSON lines {"step", "samples": [ids]} appended by the SFT trainer, one per step trained.
    data_order = _Under("data_order.jsonl")

    def rollout_step(self, step: int) -> Path:
        return self.rollouts / f"step_{step}"

    def broadcast_step(self, step: int) -> Path:
        return self.broadcasts / f"step_{step}"

    def checkpoint_step(self, step: int) -> Path:
        return self.checkpoints / f"step_{step}"

    def checkpoint_hf(self, step: int) -> Path:
        """The HF-format weights an SFT checkpoint carries next to its trainer state."""
        return self.checkpoint_step(step) / "hf"

    def wandb_offline_runs(self) -> list[Path]:
        """The run's W&B offline directories, oldest first (their names start with the attempt's start time)."""
        return sorted(self.wandb.glob("offline-run-*")) if self.wandb.is_dir() else []

    # Inference replicas that joined on their own Slurm jobs (``srl inference join``): one inference deployment
    # directory each, ``replica-<n>``, written by the launch pipeline like any ``srl inference`` run.
    replicas = _Under("replicas")
    # JSON lines appended by the orchestrator when a replica joins or leaves (toolkit.orchestrator.replicas).
    replica_events = _Under("replicas", "events.jsonl")

    def replica_run(self, n: int) -> RunDir:
        """The run directory of replica ``n`` of this run."""
        return RunDir(self.replicas / f"replica-{n}")

    def replica_numbers(self) -> list[int]:
        """Numbers of the replicas submitted for this run, ascending."""
        return _numbered(self.replicas, _REPLICA_RE)

    def replica_runs(self) -> list[RunDir]:
        """The run directories of the replicas submitted for this run, by number."""
        return [self.replica_run(n) for n in self.replica_numbers()]

    # The first-run gate's Slurm jobs (toolkit.evalgate), one run directory per command below it.
    gates = _Under("eval")

    def gate_run(self, command: str) -> RunDir:
        """The run directory of this run's first-run gate job ``srl eval <command>`` (``validate`` or ``run``):
        its attempts, plan, batch scripts and logs. The verdict itself goes to this run's ``reports/``."""
        return RunDir(self.gates / command)

    def gate_spec(self, attempt: int | None = None) -> Path:
        """A gate job's options (``toolkit.evalgate``: command, parsed options, verdict directory) of an attempt
        (default latest), written on the login node and read by the job."""
        base = self.latest_configs if attempt is None else self.config_attempt(attempt)
        return base / "gate.json"

    # -- control -------------------------------------------------------------------------------
    control = _Under("control")
    # File whose existence asks the trainer and orchestrator to checkpoint and exit 0.
    stop_request = _Under("control", "STOP")
    # JSON written by the inference launcher once every engine (and router) answers /health.
    inference_ready = _Under("control", "inference_ready.json")
    # One progress record per trainer rank and orchestrator, read by the supervisor's watchdog (toolkit.run.heartbeat).
    progress = _Under("progress")
    # Run-local scratch on the shared filesystem (e.g. the P/D ExampleConnector KV store).
    scratch = _Under("scratch")

    # -- attempts ------------------------------------------------------------------------------
    def attempts(self) -> list[int]:
        """Attempt numbers present under configs/, ascending."""
        return sorted(_numbered(self.configs, _ATTEMPT_RE))

    def next_attempt(self) -> int:
        got = self.attempts()
        return (got[-1] + 1) if got else 1


def numbered_steps(parent: Path) -> list[int]:
    """Step numbers of ``step_<n>`` directories under ``parent``, ascending (temp dirs are ignored)."""
    return sorted(_numbered(parent, _STEP_RE))


def newest_stable_broadcast(run: RunDir) -> tuple[int, Path] | None:
    """The newest ``broadcasts/step_<n>`` holding a STABLE marker, as ``(n, dir)``, or None when there is none
    (what engines load at start and what ``srl status`` reports as the newest policy)."""
    for step in reversed(numbered_steps(run.broadcasts)):
        d = run.broadcast_step(step)
        if (d / STABLE_MARKER).exists():
            return step, d
    return None


def _numbered(parent: Path, pattern: re.Pattern[str]) -> list[int]:
    if not parent.is_dir():
        return []
    out = []
    for entry in parent.iterdir():
        m = pattern.match(entry.name)
        if m and entry.is_dir():
            out.append(int(m.group(1)))
    return out


def point_symlink(link: Path, target_name: str) -> None:
    """Atomically make ``link`` a relative symlink to ``target_name`` (a sibling), replacing any old link.

    A symlink is created under a temporary name and renamed over the old one, so readers never see
    the link missing (rename is atomic on POSIX filesystems, NFS and Lustre included).
    """
    tmp = link.with_name(f".{link.name}.tmp.{os.getpid()}")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(target_name, tmp)
    os.replace(tmp, link)
