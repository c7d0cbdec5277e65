"""A tool environment on the real local Slurm cluster:
`srl rl @ jobs/code-lookup/rl.toml @ jobs/reverse-text/slurm.toml` (srl's built-in `srl-code-lookup`: a verifiers
tool server per env worker, episodes through verifiers' own rollout, harness programs forked from the worker's fork
server) submitted as a user would, for 2 steps.

Checks: the job ends COMPLETED with trainer and orchestrator steps 1-2 each recorded once; every train rollout was
played through verifiers' rollout with the tool schema in its prompt (prompts of the Hermes tool section's length,
not the bare question's) and none errored; the eval recorded the taskset's tool-use metrics with their standard
errors; the worker log says why the env took verifiers' path; nothing of the run is left running.
"""

from __future__ import annotations

import pytest
from run_records import metrics_lines, processes_left, submit_slurm_rl

from toolkit.launch import slurm

pytestmark = [pytest.mark.slow, pytest.mark.slurm, pytest.mark.vllm]

# Engine start-up and 2 steps of 32 tool episodes on two cores shared by four emulated nodes.
BUDGET_S = 1200.0


def test_a_tool_env_trains_on_slurm_through_verifiers_rollout(tmp_path, slurm_cluster):
    run, job = submit_slurm_rl(
        tmp_path,
        "tools",
        "--max-steps",
        "2",
        "--orchestrator.eval.env.code-lookup-test.num-examples",
        "8",
        configs=("jobs/code-lookup/rl.toml", "jobs/reverse-text/slurm.toml"),
    )
    state = slurm.wait(job, timeout_s=BUDGET_S, poll_s=2.0)
    logs = "\n".join(p.read_text()[-4000:] for p in sorted(run.logs.rglob("*.log")) + sorted(run.logs.glob("*.out")))
    assert state.state == "COMPLETED", f"job {job} ended {state.state}\n{logs}"
    metrics = metrics_lines(run.root)
    for role in ("trainer", "orchestrator"):
        steps = [m["step"] for m in metrics if m["role"] == role and m["step"] > 0 and "time/step" in m]
        assert steps == [1, 2], (role, steps)
    orch = [m for m in metrics if m["role"] == "orchestrator" and "time/step" in m and m["step"] > 0]
    assert all(m["errored_rollouts"] == 0 for m in orch), orch
    # The bare question is ~60 tokens; with the tool section the Hermes renderer writes, ~520.
    assert all(m["seq_len/mean"] > 400 for m in orch), [m["seq_len/mean"] for m in orch]
    evals = [m for m in metrics if "eval/code-lookup-test/metric/lookup_calls" in m]
    assert evals and all("eval/code-lookup-test/metric/lookup_calls/stderr" in m for m in evals), metrics
    orch_log = "\n".join(p.read_text() for p in run.logs.glob("attempt_*/orchestrator*.log"))
    assert "env code-lookup runs through verifiers' own rollout" in orch_log and "serves tools" in orch_log
    assert processes_left(run.root) == []
