"""``srl eval run`` on environments that run through verifiers' own rollout (best-of-two: an Env class of its own,
two attempts per episode; codebook-lookup: a tool server), against an OpenAI-compatible endpoint: the loopback
server (tests/loopback_server.py), which answers every completion with "yes" and the end of turn. The env workers
run the episodes with verifiers' code, as in training; every rollout is recorded in the gate's store, none errors,
and the traces check passes (each valid rollout has prompt tokens and policy-sampled tokens).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from loopback_server import LoopbackServer

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "vf_envs"
# background_half: scripts/test.sh runs it beside the Slurm tests, to even out the halves' times.
pytestmark = [pytest.mark.slow, pytest.mark.background_half]

CONFIG = f"""seed = 0
output_dir = "outputs"
[model]
name = "tiny-qwen3"
[orchestrator]
group_size = 2
max_concurrent = 8
[orchestrator.renderer]
name = "hermes"
[orchestrator.train.sampling]
max_completion_tokens = 8
[[orchestrator.train.env]]
name = "bo2"
taskset = {{ id = "best-of-two" }}
harness = {{ id = "default", runtime = {{ type = "subprocess" }} }}
[[orchestrator.train.env]]
name = "codes"
taskset = {{ id = "codebook-lookup" }}
harness = {{ id = "default", runtime = {{ type = "subprocess" }} }}
max_turns = 2
[env_vars]
PYTHONPATH = "{FIXTURES}"
"""


def test_eval_run_on_envs_of_verifiers_own_rollout(tmp_path):
    from toolkit.models import resolve_model
    from toolkit.models.renderer import HermesRenderer

    hermes = HermesRenderer(resolve_model("tiny-qwen3"))
    yes = hermes.encode("yes") + [hermes.stop_token_ids[0]]
    (tmp_path / "gate.toml").write_text(CONFIG)
    with LoopbackServer(yes) as srv:
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "toolkit.cli",
                "eval",
                "run",
                "@",
                str(tmp_path / "gate.toml"),
                "--base-url",
                srv.url,
                "-m",
                "loopback",
                "--tokenizer",
                str(resolve_model("tiny-qwen3")),
                "-n",
                "2",
                "-r",
                "2",
                "--run-dir",
                str(tmp_path / "gate"),
                "--no-rich",
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
    out = r.stdout + r.stderr
    gate = tmp_path / "gate" / "reports" / "eval_gate.json"
    assert gate.is_file(), out[-3000:]
    verdict = json.loads(gate.read_text())
    items = {(i["env"], i["key"]): i for i in verdict["items"]}
    for env in ("bo2", "codes"):
        traces = items[(env, "traces_recorded")]
        assert traces["status"] == "PASS", (traces, out[-3000:])
        assert traces["evidence"]["valid_rollouts"] >= 4 and traces["evidence"]["store_rows"] >= 4, traces
        assert items[(env, "error_rate")]["status"] == "PASS", (items[(env, "error_rate")], out[-3000:])
    assert "Traceback" not in out, out[-3000:]
