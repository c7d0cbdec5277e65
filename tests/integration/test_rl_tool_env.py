"""`srl rl` on a tool environment, end to end, locally: tiny model, real vLLM CPU engine, the codebook-lookup taskset
(tests/fixtures/vf_envs: each task serves an MCP tool server) run by verifiers' own rollout in the env workers,
with verifiers' ``null`` harness program, the task's tool server, and srl's policy as the model.

The run reaches max_steps (3) with no errored rollout; every step trained on real samples (the trace branches of
multi-turn episodes the policy sampled, the tool schemas in their prompts) and the trainer's logprobs of the
sampled tokens agree with the engine's (mismatch_kl below 1e-3: the samples are exactly the sampled token ids).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from prereqs import need_module

ROOT = Path(__file__).resolve().parents[2]
VF_ENVS = ROOT / "tests" / "fixtures" / "vf_envs"
pytestmark = [pytest.mark.slow, pytest.mark.vllm]  # about 2 minutes on an idle machine


def test_rl_on_a_tool_env_trains_three_steps_through_verifiers_rollout(tmp_path):
    need_module("torch")
    need_module("vllm")
    log = tmp_path / "srl.out"
    with open(log, "wb") as out:
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "toolkit.cli",
                "rl",
                "@",
                str(VF_ENVS / "rl-tools.toml"),
                "--env-vars.PYTHONPATH",
                str(VF_ENVS),
                "--output-dir",
                str(tmp_path),
                "--run.name",
                "tools",
            ],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=1500,
            check=False,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    text = log.read_text()
    assert r.returncode == 0 and "reached max_steps (step 3)" in text, text[-4000:]
    run = tmp_path / "tools"
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    orch = {m["step"]: m for m in lines if m["role"] == "orchestrator"}
    trainer = {m["step"]: m for m in lines if m["role"] == "trainer"}
    assert sorted(trainer) == [1, 2, 3] and {1, 2, 3} <= set(orch), sorted(orch)
    for step in (1, 2, 3):
        o = orch[step]
        # Over 400 tokens: the tool's schema is in the prompt (the question alone is about 100 characters).
        assert o["errored_rollouts"] == 0 and o["num_turns/mean"] >= 1 and o["seq_len/mean"] > 400, o
        assert trainer[step]["mismatch_kl/mean"] < 1e-3, trainer[step]
    log_text = (run / "logs" / "attempt_1" / "orchestrator.log").read_text()
    assert "runs through verifiers' own rollout" in log_text and "serves tools" in log_text
