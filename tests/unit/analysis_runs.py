"""Build run directories for the analysis tests the way a run writes them.

Rollouts go through ``RolloutStoreWriter`` as ``toolkit.run.types.Rollout`` objects, metrics through
``toolkit.fsutil.append_jsonl`` and logs as text files under ``RunDir`` paths, so the readers under test see exactly
the bytes a run would leave. ``failure`` injects one failure kind (the faults a healthy simulated run cannot
produce by itself): provider, harness, toolset, sandbox, task, all_zero, low_reward, trainer, or a Slurm cause
(timeout, oom, node_fail, preempt, cancelled).
"""

from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path
from typing import Any

from toolkit.fsutil import append_jsonl, atomic_write_json
from toolkit.run.layout import RunDir, point_symlink
from toolkit.run.store import RolloutStoreWriter
from toolkit.run.types import Rollout, TrainingSample

ERROR_FAILURES = {
    "provider": (
        "ProviderError",
        "httpx.ConnectError: [Errno 111] Connection refused (router http://n1:8000)",
    ),
    "harness": ("HarnessError", "harness 'default' exited with status 127"),
    "toolset": ("ToolsetError", "tool server wiki-search did not answer within 30 s"),
    "sandbox": ("SandboxError", "sandbox creation rate limited (429)"),
    "task": ("TaskError", "scoring raised ZeroDivisionError: division by zero"),
    "reward_skipped": ("RewardSkippedError", "task scoring skipped ['checked']: verifiers leaves a signal unscored"),
}
SLURM_LINES = {
    "timeout": "slurmstepd: error: *** JOB 4242 ON node1 CANCELLED AT 2025-01-01T10:00:00 DUE TO TIME LIMIT ***",
    "oom": "slurmstepd: error: Detected 1 oom-kill event(s) in StepId=4242.0. Some of your processes may have been "
    "killed by the cgroup out-of-memory handler.",
    "node_fail": "slurmstepd: error: *** JOB 4242 ON node1 CANCELLED AT 2025-01-01T10:00:00 DUE TO NODE FAILURE ***",
    "preempt": "slurmstepd: error: *** JOB 4242 ON node1 CANCELLED AT 2025-01-01T10:00:00 DUE TO PREEMPTION ***",
    "cancelled": "slurmstepd: error: *** JOB 4242 ON node1 CANCELLED AT 2025-01-01T10:00:00 ***",
}

CONFIG: dict[str, Any] = {
    "output_dir": "/tmp",
    "run": {"name": "test"},
    "max_steps": 8,
    "seed": 0,
    "model": {"name": "tiny-test-model", "dtype": "bfloat16"},
    "orchestrator": {
        "training_mode": "rl",
        "batch_size": 16,
        "group_size": 4,
        "max_async_level": 1,
        "max_concurrent": 16,
        "renderer": {"name": "auto"},
        "train": {
            "sampling": {"temperature": 1.0, "max_completion_tokens": 64},
            "env": [
                {
                    "name": "arith",
                    "ratio": 1,
                    "taskset": {"id": "srl-arith", "split": "train"},
                    "harness": {"id": "default", "runtime": {"type": "subprocess"}},
                    "max_turns": 1,
                    "timeout": {"rollout": 60, "scoring": 10},
                },
                {
                    "name": "reverse-text",
                    "ratio": 1,
                    "taskset": {"id": "srl-reverse-text", "split": "train"},
                    "harness": {"id": "default", "runtime": {"type": "subprocess"}},
                    "max_turns": 1,
                },
            ],
        },
        "eval": {
            "interval": 3,
            "env": [
                {
                    "name": "arith-test",
                    "taskset": {"id": "srl-arith", "split": "test"},
                    "num_examples": 4,
                    "group_size": 2,
                }
            ],
        },
    },
    "trainer": {"optim": {"lr": 1e-5}, "seq_len": 256, "micro_batch_size": 1},
    "deployment": {"type": "single_node", "gpus_per_node": 2, "num_train_gpus": 1, "num_infer_gpus": 1},
    "ckpt": {"interval": 2, "keep_last": 2},
    "monitors": {"stop": {"max_errored_share": 0.4, "errored_patience_steps": 3}},
}


def _rollout(
    rng: random.Random,
    env: str,
    step: int,
    gid: int,
    example: int,
    reward: float,
    error: tuple[str, str] | None,
) -> Rollout:
    npr, nco = rng.randint(5, 12), rng.randint(3, 20)
    mask = [True] * nco
    sample = TrainingSample(
        prompt_ids=[rng.randrange(1000) for _ in range(npr)],
        completion_ids=[rng.randrange(1000) for _ in range(nco)],
        completion_mask=mask,
        completion_logprobs=[-rng.random() * 3 for _ in range(nco)],
    )
    truncated = nco >= 19
    return Rollout(
        env=env,
        task_id=f"{env}-{example}",
        example_id=example,
        samples=[] if error else [sample],
        reward=0.0 if error else reward,
        reward_components={} if error else {"correct": reward},
        num_turns=0 if error else 1,
        truncated=truncated and not error,
        truncation_reason="max_tokens" if truncated and not error else None,
        error_class=error[0] if error else None,
        error_message=error[1] if error else None,
        policy_version=max(step - 1, 0),
        group_id=gid,
        timings={"generate": rng.random(), "score": 0.01},
    )


def _group(
    rng: random.Random, env: str, step: int, gid: int, size: int, failure: str | None, p_solve: float
) -> list[Rollout]:
    example = rng.randrange(100)
    error = ERROR_FAILURES.get(failure or "")
    out = []
    for i in range(size):
        err = error if error and (i % 2 == 0) else None  # half of each group fails: the class is clearly present
        if failure == "all_zero":
            reward = 0.0
        elif failure == "low_reward":
            reward = 0.05 * rng.random()  # continuous, valid, low; some groups not all-zero
        else:
            reward = 1.0 if rng.random() < p_solve else 0.0
        out.append(_rollout(rng, env, step, gid, example, reward, err))
    valid = [r for r in out if r.error_class is None]
    mean = sum(r.reward for r in valid) / len(valid) if valid else 0.0
    for r in valid:
        r.advantage = r.reward - mean
    return out


def make_run(
    root: Path,
    *,
    failure: str | None = None,
    steps: int = 8,
    group_size: int = 4,
    groups_per_env: int = 2,
    seed: int = 0,
    meta: dict[str, Any] | None = None,
    lr: float = 1e-5,
) -> RunDir:
    """Write a run directory under ``root`` with ``steps`` train steps (two envs) and eval at steps 0, 3, 6, ...

    Returns its ``RunDir``. Rewards improve with the step (faster with larger ``lr``) unless ``failure`` says
    otherwise.
    """
    run = RunDir(root)
    rng = random.Random(seed)
    cfg_dir = run.config_attempt(1) / "resolved"
    cfg_dir.mkdir(parents=True)
    point_symlink(run.latest_configs, "attempt_1")
    atomic_write_json(cfg_dir / "rl.json", CONFIG)
    atomic_write_json(run.run_meta, {"run_id": f"r{seed}", "created": 1.7e9, **(meta or {})})
    run.log_attempt(1).mkdir(parents=True)
    point_symlink(run.latest_logs, "attempt_1")
    orch_log = run.log_attempt(1) / "orchestrator.log"
    orch_lines = ["INFO orchestrator started", "INFO connected to router http://node1:8000"]
    t0 = time.time()  # the store stamps rows with the wall clock; metrics must share its time base
    gid = 0
    with RolloutStoreWriter(run.rollout_store) as writer:
        for step in range(steps):
            batch: list[Rollout] = []
            for env, base in (("arith", 0.3), ("reverse-text", 0.5)):
                p = min(base + lr * 3e3 * step, 0.95)
                for _ in range(groups_per_env):
                    batch += _group(rng, env, step, gid, group_size, failure, p)
                    gid += 1
            writer.append(batch, step=step)
            for r in batch:
                if r.error_class:
                    orch_lines.append(
                        f"WARNING step {step} rollout {r.task_id} failed: {r.error_class}: {r.error_message}"
                    )
            if step % 3 == 0:
                ev = []
                for _ in range(2):
                    ev += _group(rng, "arith-test", step, gid, 2, None, 0.3 + 0.05 * step)
                    gid += 1
                writer.append(ev, step=step, kind="eval")
                mean = sum(r.reward for r in ev) / len(ev)
                append_jsonl(
                    run.metrics,
                    {
                        "step": step,
                        "time": t0 + step * 10 + 5,
                        "role": "orchestrator",
                        "eval/arith-test/avg@2": mean,
                        "eval/arith-test/pass@2": min(1.0, mean * 1.5),
                    },
                )
            valid = [r for r in batch if r.error_class is None]
            append_jsonl(
                run.metrics,
                {
                    "step": step,
                    "time": t0 + step * 10,
                    "role": "orchestrator",
                    "reward/all/mean": sum(r.reward for r in valid) / max(len(valid), 1),
                    "errored_rollouts": len(batch) - len(valid),
                    "effective_batch_size": len(valid),
                    "time/step": 9.5,
                    "time/wait_for_policy": 0.5,
                    "off_policy/mean": 0.8,
                    "off_policy/max": 1,
                },
            )
            append_jsonl(run.metrics, _trainer_metrics(step, t0, failure, rng))
    orch_log.write_text("\n".join(orch_lines) + "\n")
    (run.log_attempt(1) / "trainer.log").write_text("INFO trainer started\nINFO step 0 done\n")
    if failure in SLURM_LINES:
        (run.log_attempt(1) / "slurm-4242.out").write_text(f"INFO srl launching\n{SLURM_LINES[failure]}\n")
    return run


def _trainer_metrics(step: int, t0: float, failure: str | None, rng: random.Random) -> dict[str, Any]:
    kl = 1e-4 * (1 + 0.1 * rng.random())
    grad = 0.5 + 0.1 * rng.random()
    loss = 0.01 * rng.random()
    entropy = 1.2 - 0.02 * step
    if failure == "trainer":
        kl = 1e-4 * math.exp(step)  # grows ~e^7 over the run
        grad = 500.0 if step == 5 else grad
        loss = float("nan") if step == 7 else loss
    return {
        "step": step,
        "time": t0 + step * 10 + 8,
        "role": "trainer",
        "loss/mean": loss,
        "entropy/mean": entropy,
        "mismatch_kl/mean": kl,
        "mismatch_kl/max": kl * 5,
        "is_masked/mean": 0.002,
        "optim/grad_norm": grad,
        "optim/lr": 1e-5,
        "perf/throughput": 900 + 10 * step,
        "perf/peak_memory": 2.1e9,
        "time/step": 8.0,
        "time/wait_for_batch": 1.5,
        "time/broadcast": 0.2,
    }


def read_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
