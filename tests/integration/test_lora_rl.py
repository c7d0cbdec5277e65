"""A 3-step LoRA RL run on CPU with the real tiny model and a real vLLM engine: the served policy follows the trainer.

`srl rl @ jobs/reverse-text/rl-lora.toml` runs on-policy (``max_async_level = 0``) for 3 trainer steps with a large
learning rate, so each adapter moves the policy far from the base model. Checked:

- every broadcast is a PEFT adapter directory (no full weights), STABLE last, and the engines' fixed adapter path
  holds a recent one;
- the orchestrator loaded versions 1 and 2 into the engine (``policy_reloads.jsonl``, the engine's /weight_info);
- the trainer's mismatch_kl (trainer vs engine logprobs of the same tokens) stays below 1e-3 on the batches sampled
  by the adapters;
- the sampling logprobs of batch 3 (policy version 2, served as a LoRA adapter) equal the trainer's peft model with
  adapter step_2 loaded, and are far from the base model's (the test fails if the engine served the base model).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from lora_checks import assert_adapter_broadcasts, assert_serves_adapter
from prereqs import need_module
from run_records import served_version

ROOT = Path(__file__).resolve().parents[2]
# About 65 s: runs with the heavy tests (scripts/test.sh -m heavy) to keep CI's whole run under 60 minutes. CI checks
# the adapter broadcasts, the reloads and that each batch was sampled by the trainer's adapter in
# tests/integration/test_shared_deployment_lora.py (two LoRA runs on one deployment, same job, same checks).
pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.heavy]


def test_lora_run_serves_the_trainers_adapter(tmp_path):
    need_module("torch")
    need_module("peft")
    name = "lora"
    cmd = [
        sys.executable,
        "-m",
        "toolkit.cli",
        "rl",
        "@",
        str(ROOT / "jobs/reverse-text/rl-lora.toml"),
        "--output-dir",
        str(tmp_path),
        "--run.name",
        name,
        "--max-steps",
        "3",
        "--orchestrator.max-async-level",
        "0",
        "--orchestrator.batch-size",
        "16",
        "--trainer.optim.lr",
        "3e-2",
        "--weight-broadcast.keep",
        "3",
        "--orchestrator.eval.interval",
        "0",
    ]
    out = tmp_path / "srl.out"
    with open(out, "wb") as log:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, timeout=900, check=False)
    assert proc.returncode == 0, out.read_text()[-4000:]
    run = tmp_path / name

    from toolkit.batches import load_batch_dir
    from toolkit.run.layout import RunDir

    rd = RunDir(run)
    assert_adapter_broadcasts(run, (1, 2, 3))

    # Engines read the adapter from one fixed path whose content is the newest loaded version (weights.stage_adapter).
    served = rd.broadcasts / "lora_served" / "adapter_model.safetensors"
    assert served.read_bytes() in [(rd.broadcast_step(s) / "adapter_model.safetensors").read_bytes() for s in (2, 3)]

    reloads = [json.loads(line) for line in rd.policy_reloads.read_text().splitlines()]
    loaded = {r["version"] for r in reloads}
    assert {1, 2} <= loaded, reloads
    for r in reloads:
        assert set(r["engines"].values()) == {served_version(run, r["version"])}, r

    metrics = [json.loads(line) for line in rd.metrics.read_text().splitlines()]
    kl = {m["step"]: m["mismatch_kl/mean"] for m in metrics if m["role"] == "trainer" and "mismatch_kl/mean" in m}
    print("mismatch_kl by trainer step:", kl)
    assert kl.get(2) is not None and kl.get(3) is not None
    assert kl[2] < 1e-3 and kl[3] < 1e-3

    batch = load_batch_dir(rd.rollout_step(3))
    assert set(batch.policy_version.tolist()) == {2}  # on-policy: sampled by the adapter of step 2
    gap_policy, gap_base, n = assert_serves_adapter(run, batch_step=3, adapter_step=2)
    print(f"mean |logprob gap| over {n} sampled tokens: adapter model {gap_policy:.2e}, base model {gap_base:.2e}")
