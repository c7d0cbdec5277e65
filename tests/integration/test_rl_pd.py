"""The reverse-text RL run on a disaggregated deployment: one prefill and one decode engine with ExampleConnector
behind vllm-router in P/D mode, prompts padded past one 128-token KV block.

``srl rl @ jobs/reverse-text/rl.toml @ jobs/reverse-text/rl-pd.toml --max-steps N --orchestrator.max-async-level 0``
is started as a user would and must finish (status 0): N = 3 in the default selection (CI), N = 20 in the heavy
one. ``max_async_level = 0`` because mismatch_kl is measured on
on-policy samples only (sampled by exactly the weights the trainer holds): with the job's level 1 every batch after
step 1 is one version old, so mismatch_kl would be measured on step 1 alone, on the base model, and would say
nothing about the reloaded weights. Fully on-policy, every step's batch comes from the version just reloaded into
both engines. Then, from the run directory only:

- ``metrics.jsonl``: trainer and orchestrator steps 1..N, each exactly once; ``mismatch_kl/mean`` < 1e-3 on every
  trainer step it is measured, and it is measured on most steps;
- ``launcher/placement.json``: one prefill engine (kv_producer), one decode engine (kv_consumer), a router;
- ``policy_reloads.jsonl`` (written by the orchestrator's PolicyTracker after each reload, before the client tags
  any request with the new version): versions strictly increase, and every engine of the placement, the prefill
  and the decode one, reported that version at ``/weight_info``. Every policy version found on a train rollout in
  ``store/rollouts.h5`` has such a record, written before the rollout was stored; the orchestrator's log names
  the same reloads;
- the decode engine's log: "Inject KV cache of N tokens" lines (ExampleConnector loading the prefill engine's KV
  instead of recomputing it) with N >= one 128-token block, and "External Cache Hit!"; the prefill engine's log
  has no injection (it produces KV). Train prompts are all longer than one block.

``test_rl_prefill_decode_lora`` runs the LoRA job on the same deployment (adapters loaded in place on both
engines; see its docstring).

Two engines + router + trainer + env workers on 2 cores: the 3-step run takes about 1.5 minutes (93 s measured),
the 20-step run and the LoRA run several minutes each (marked heavy: ``scripts/test.sh -m heavy``).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest
from prereqs import need_module
from run_records import is_final_eval_line, served_version

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.timeout(3600)]

REPO = Path(__file__).resolve().parents[2]
MAX_ASYNC_LEVEL = 0  # overrides the job's 1 (module docstring)
KV_BLOCK_TOKENS = 128  # vLLM's CPU block size: only whole blocks move through the connector
RUN_TIMEOUT_S = 2400  # start-up of two engines plus 20 steps on a loaded 2-core machine
INJECT_RE = re.compile(r"Inject KV cache of (\d+) tokens")


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _engine_logs(run: Path) -> dict[str, tuple[int, Path]]:
    """kv role ("kv_producer"/"kv_consumer") -> (HTTP port, log path) of each engine in placement.json."""
    plan = json.loads((run / "launcher" / "placement.json").read_text())
    roles = [p["role"] for p in plan["processes"]]
    assert roles.count("router") == 1, roles
    engines = [p for p in plan["processes"] if p["role"] == "inference"]
    kinds = sorted(p["kv_role"] for p in engines)
    assert kinds == ["kv_consumer", "kv_producer"], kinds  # exactly one prefill and one decode engine
    return {
        p["kv_role"]: (
            urlparse(p["healthcheck_url"].replace("{node_addr}", "h")).port,
            run / "logs" / "latest" / p["log_name"],
        )
        for p in engines
    }


def _run_srl(argv: list[str]) -> float:
    """Run ``srl rl`` as a user would; fails the test on a non-zero status or after RUN_TIMEOUT_S. Returns the
    wall time (seconds)."""
    t0 = time.monotonic()
    proc = subprocess.Popen(
        argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        text, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # the launcher stops its engines, router and roles (own sessions)
        try:
            text, _ = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            text, _ = proc.communicate()
        pytest.fail(f"the run did not finish within {RUN_TIMEOUT_S} s:\n{text[-5000:]}")
    assert proc.returncode == 0, text[-5000:]
    return time.monotonic() - t0


def _reloads_on_both_engines(run: Path, logs: dict[str, tuple[int, Path]]) -> list[dict]:
    """The run's policy reload records, checked: versions strictly increase and each was reported at
    ``/weight_info`` by the prefill and the decode engine; the orchestrator's log names the same reloads."""
    ports = {logs["kv_producer"][0]: "prefill", logs["kv_consumer"][0]: "decode"}
    reloads = [json.loads(line) for line in (run / "policy_reloads.jsonl").read_text().splitlines()]
    versions = [r["version"] for r in reloads]
    assert versions == sorted(set(versions)) and versions, versions
    for r in reloads:
        by_role = {ports.get(urlparse(url).port): reported for url, reported in r["engines"].items()}
        v = served_version(run, r["version"])
        assert by_role == {"prefill": v, "decode": v}, r
        assert sorted(r["roles"].values()) == ["decode", "prefill"], r
        # the phases split the pause-to-resume time (the lookups before it and the purge after it are left out)
        inside = sum(r["phases"][k] for k in ("pause", "reload", "retire_reset_version", "resume"))
        assert abs(inside - r["seconds"]) < 0.01, r
    orch_log = (run / "logs" / "latest" / "orchestrator.log").read_text()
    logged = [int(v) for v in re.findall(r"policy version (\d+) loaded into inference", orch_log)]
    assert logged == versions, (logged, versions)
    return reloads


def _kv_injections(logs: dict[str, tuple[int, Path]]) -> tuple[list[int], int]:
    """Token counts of the decode engine's KV injections (ExampleConnector loading the prefill engine's KV instead
    of recomputing it) and its external cache hits; the prefill engine must have injected nothing."""
    decode_log = logs["kv_consumer"][1].read_text(errors="replace")
    prefill_log = logs["kv_producer"][1].read_text(errors="replace")
    assert not INJECT_RE.search(prefill_log)
    return [int(n) for n in INJECT_RE.findall(decode_log)], decode_log.count("External Cache Hit!")


@pytest.mark.parametrize("max_steps", [3, pytest.param(20, marks=pytest.mark.heavy)], ids=lambda n: f"{n}-steps")
def test_rl_prefill_decode(tmp_path, max_steps):
    out = tmp_path / "out"
    run = out / "pd"
    argv = [
        sys.executable,
        "-m",
        "toolkit.cli",
        "rl",
        "@",
        str(REPO / "jobs/reverse-text/rl.toml"),
        "@",
        str(REPO / "jobs/reverse-text/rl-pd.toml"),
        "--max-steps",
        str(max_steps),
        "--orchestrator.max-async-level",
        str(MAX_ASYNC_LEVEL),
        "--output-dir",
        str(out),
        "--run.name",
        "pd",
    ]
    wall_s = _run_srl(argv)

    # -- steps, each exactly once; mismatch_kl on every measured step ----------------------------------------
    metrics = _metrics(run)
    for role in ("trainer", "orchestrator"):
        steps = sorted(m["step"] for m in metrics if m["role"] == role and m["step"] > 0 and not is_final_eval_line(m))
        assert steps == list(range(1, max_steps + 1)), (role, steps)
    kls = [m["mismatch_kl/mean"] for m in metrics if m["role"] == "trainer" and "mismatch_kl/mean" in m]
    assert len(kls) >= max_steps // 2, f"mismatch_kl measured on {len(kls)} steps only"
    assert max(kls) < 1e-3, kls

    # -- every reload reached both engines before rollouts of that version --------------------------------------
    logs = _engine_logs(run)
    reloads = _reloads_on_both_engines(run, logs)
    versions = [r["version"] for r in reloads]
    # The bound of the last step needs policy >= max_steps - 1 - max_async_level: it must have been loaded.
    assert versions[-1] >= max_steps - 1 - MAX_ASYNC_LEVEL, versions

    from toolkit.run.store import load_rollouts

    train = load_rollouts(run / "store" / "rollouts.h5", ["time", "policy_version", "prompt_len"], kind="train")
    assert len(train) >= max_steps * 32  # batch_size 32 rollouts per step
    loaded_at = {r["version"]: r["time"] for r in reloads}
    used = sorted(int(v) for v in set(train["policy_version"]) if v > 0)
    assert used and set(used) <= set(loaded_at), (used, versions)
    for v in used:
        first_stored = float(train.loc[train["policy_version"] == v, "time"].min())
        assert loaded_at[v] < first_stored, (v, loaded_at[v], first_stored)
    assert int(train["prompt_len"].min()) > KV_BLOCK_TOKENS  # every prompt spans more than one KV block

    # -- the decode engine loaded the prefill engine's KV instead of recomputing it ----------------------------
    injected, hits = _kv_injections(logs)
    assert injected and min(injected) >= KV_BLOCK_TOKENS, injected[:20]
    assert hits >= len(used), hits  # at least one external hit per policy version served

    print(
        f"\n[figure] P/D RL: {max_steps} steps in {wall_s:.0f} s wall; {len(reloads)} reloads (versions "
        f"{versions[0]}..{versions[-1]}), each reported by prefill and decode /weight_info; rollout versions used "
        f"{used[0]}..{used[-1]}; decode KV injections {len(injected)} ({sum(injected)} tokens, min "
        f"{min(injected)}), external cache hits {hits}, train rollouts {len(train)}, prompt_len "
        f"{int(train['prompt_len'].min())}..{int(train['prompt_len'].max())}; mismatch_kl max {max(kls):.2e} "
        f"on {len(kls)} steps"
    )


LORA_STEPS = 4


@pytest.mark.heavy
def test_rl_prefill_decode_lora(tmp_path):
    """LoRA on the disaggregated deployment: both engines serve the trainer's newest adapter, and the KV the decode
    engine injects was computed by the prefill engine with that adapter.

    ``rl-lora.toml`` overlaid by ``rl-pd.toml``, on-policy, with a learning rate large enough (3e-2) that each
    adapter moves the policy far from the base model. Checked: every broadcast is an adapter directory; every reload
    reached prefill and decode; the decode engine injected KV of at least one block; the trainer's mismatch_kl
    stays < 1e-3; and the last batch's sampling logprobs equal the adapter model's and are far from the base
    model's. Prefill KV computed without the adapter (or with an older one) would put the decode engine's logprobs
    between the two and fail the last checks.
    """
    need_module("peft")
    from lora_checks import assert_adapter_broadcasts, assert_serves_adapter

    out = tmp_path / "out"
    run = out / "pd-lora"
    argv = [
        sys.executable,
        "-m",
        "toolkit.cli",
        "rl",
        "@",
        str(REPO / "jobs/reverse-text/rl-lora.toml"),
        "@",
        str(REPO / "jobs/reverse-text/rl-pd.toml"),
        "--max-steps",
        str(LORA_STEPS),
        "--orchestrator.max-async-level",
        "0",
        "--orchestrator.batch-size",
        "16",
        "--trainer.optim.lr",
        "3e-2",
        "--weight-broadcast.keep",
        str(LORA_STEPS),
        "--orchestrator.eval.interval",
        "0",
        "--output-dir",
        str(out),
        "--run.name",
        "pd-lora",
    ]
    wall_s = _run_srl(argv)

    assert_adapter_broadcasts(run, range(1, LORA_STEPS + 1))
    logs = _engine_logs(run)
    reloads = _reloads_on_both_engines(run, logs)
    versions = [r["version"] for r in reloads]
    assert versions[-1] >= LORA_STEPS - 1, versions  # on-policy: the last batch needs the newest adapter

    metrics = _metrics(run)
    kls = {m["step"]: m["mismatch_kl/mean"] for m in metrics if m["role"] == "trainer" and "mismatch_kl/mean" in m}
    assert len([s for s in kls if s >= 2]) >= 2, kls  # measured on batches sampled by adapters
    assert max(kls.values()) < 1e-3, kls

    injected, hits = _kv_injections(logs)
    assert injected and min(injected) >= KV_BLOCK_TOKENS, injected[:20]
    assert hits >= 1

    last = LORA_STEPS
    gap_adapter, gap_base, n = assert_serves_adapter(run, batch_step=last, adapter_step=last - 1)
    print(
        f"\n[figure] P/D + LoRA RL: {LORA_STEPS} steps in {wall_s:.0f} s wall; reloads {versions} on prefill and "
        f"decode; decode KV injections {len(injected)} (min {min(injected)} tokens), external cache hits {hits}; "
        f"mismatch_kl {kls}; batch {last} vs adapter {last - 1}: mean |logprob gap| {gap_adapter:.2e} over {n} "
        f"sampled tokens, vs base model {gap_base:.2e}"
    )
