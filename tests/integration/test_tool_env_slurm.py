"""A tool environment and a two-seat game on the real local Slurm cluster, in one run:
`srl rl @ jobs/code-lookup/rl.toml @ tests/fixtures/vf_envs/rl-seats.toml @ jobs/reverse-text/slurm.toml`
(srl's built-in `srl-code-lookup`: a verifiers tool server per env worker, harness programs forked from the
worker's fork server; `count-relay`: the fixture module's own `Env` with two trainable seats, `left` and `right`),
both through verifiers' own rollout, submitted as a user would, for 2 steps.

Checks: the job ends COMPLETED with trainer and orchestrator steps 1-2 each recorded once; no rollout errored; every
code-lookup rollout had the tool schema in its prompt (prompts of the Hermes tool section's length, not the bare
question's); the game's episodes gave one rollout per seat, both seats in every group, and the orchestrator recorded
each seat's reward; the eval recorded the taskset's tool-use metrics with their standard errors; the worker logs
say why each env took verifiers' path; nothing of the run is left running.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from run_records import metrics_lines, processes_left, submit_slurm_rl

from toolkit.launch import slurm
from toolkit.run.store import load_rollouts

pytestmark = [pytest.mark.slow, pytest.mark.slurm, pytest.mark.vllm]

ROOT = Path(__file__).resolve().parents[2]
VF_ENVS = ROOT / "tests" / "fixtures" / "vf_envs"
# Engine start-up and 2 steps of 32 tool and game episodes on two cores shared by four emulated nodes.
BUDGET_S = 1200.0


def test_a_tool_env_and_a_two_seat_game_train_on_slurm_through_verifiers_rollout(tmp_path, slurm_cluster):
    run, job = submit_slurm_rl(
        tmp_path,
        "tools",
        "--max-steps",
        "2",
        "--orchestrator.eval.env.code-lookup-test.num-examples",
        "8",
        "--env-vars.PYTHONPATH",
        str(VF_ENVS),
        configs=("jobs/code-lookup/rl.toml", "tests/fixtures/vf_envs/rl-seats.toml", "jobs/reverse-text/slurm.toml"),
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

    train = load_rollouts(run.rollout_store, kind="train")
    tools, game = train[train["env"] == "code-lookup"], train[train["env"] == "count-relay"]
    # The bare question is ~60 tokens; with the tool section the Hermes renderer writes, ~520.
    assert len(tools) and (tools["prompt_len"] > 400).all(), tools["prompt_len"].tolist()
    # Seed 0 draws the game for the first two groups: 4 episodes each, one rollout per seat.
    assert len(game) >= 8, train["env"].value_counts()
    for gid, g in game.groupby("group_id"):
        assert sorted(g["seat"].astype(str)) == ["left"] * 4 + ["right"] * 4, (gid, g["seat"].tolist())
    assert any("reward/count-relay/seat/left/mean" in m and "reward/count-relay/seat/right/mean" in m for m in orch)

    evals = [m for m in metrics if "eval/code-lookup-test/metric/lookup_calls" in m]
    assert evals and all("eval/code-lookup-test/metric/lookup_calls/stderr" in m for m in evals), metrics
    orch_log = "\n".join(p.read_text() for p in run.logs.glob("attempt_*/orchestrator*.log"))
    assert "env code-lookup runs through verifiers' own rollout" in orch_log and "serves tools" in orch_log
    assert "env count-relay runs through verifiers' own rollout" in orch_log and "own Env class" in orch_log
    assert processes_left(run.root) == []
