"""Two LoRA RL runs share one standalone deployment (real vLLM, real runs, nothing faked; about 95 s on a 2-core host).

`srl inference @ jobs/serve/tiny.toml` with LoRA on (two adapter slots), then two
`srl rl @ jobs/reverse-text/rl-lora.toml --inference.external <its run dir>` at once (different seeds, a large
learning rate so each adapter moves its policy far from the base model and from the other's). Checked:

- both runs end with every step; each reload record names that run's own adapter (``srl-lora-<run id>``) and
  the engine reported that run's own version of it; the deployment ends serving both adapters, each at its run's
  last version, and its base weights untouched;
- each broadcast is a PEFT adapter directory, and each run's last batch was sampled by its own adapter (sampling
  logprobs equal its trainer's peft model with the previous step's adapter, far from the base model's);
- each run's rollouts match its own policy: the trainer's mismatch_kl (trainer vs engine logprobs of the same
  tokens, on-policy) stays below 1e-3 on the steps sampled with adapters, and no rollout was dropped as sampled
  with another run's weights;
- while they run, a full-weight run on the same deployment is refused, naming a LoRA run and ``srl cancel``,
  and writes nothing;
- after they end, the real engine tags completions: a client of run A sees its own adapter version, and after a
  full-weight load by another run id, the same client marks what it samples as foreign (``versions.judge``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from lora_checks import assert_adapter_broadcasts, assert_serves_adapter
from prereqs import need_module
from run_records import is_final_eval_line, metrics_lines, role_steps, served_version

from toolkit.run import heartbeat
from toolkit.run.layout import RunDir

# background_half: scripts/test.sh runs it beside the Slurm tests, to even out the halves' times.
pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.timeout(1500), pytest.mark.background_half]

REPO = Path(__file__).resolve().parents[2]
STEPS = 3


def _srl(*argv: str, log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "toolkit.cli", *argv],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )


def _until(
    what: str, cond, procs: dict[str, tuple[subprocess.Popen, Path]], timeout_s: float, poll_s: float = 0.5
) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        for name, (p, log) in procs.items():
            if p.poll() is not None:
                pytest.fail(f"{name} exited ({p.returncode}) before {what}:\n{log.read_text()[-4000:]}")
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        time.sleep(poll_s)


def _stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGINT)
    try:
        p.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def _lora_run(out: Path, name: str, seed: int, dep: Path) -> list[str]:
    return [
        "rl",
        "@",
        str(REPO / "jobs/reverse-text/rl-lora.toml"),
        "--output-dir",
        str(out),
        "--run.name",
        name,
        "--inference.external",
        str(dep),
        "--max-steps",
        str(STEPS),
        "--seed",
        str(seed),
        "--orchestrator.max-async-level",
        "0",
        "--orchestrator.batch-size",
        "16",
        "--orchestrator.max-concurrent",
        "16",
        "--trainer.optim.lr",
        "3e-2",
        "--orchestrator.eval.interval",
        "0",
        "--weight-broadcast.keep",
        str(STEPS),
    ]


def test_two_lora_runs_share_a_deployment_each_on_its_own_adapter(tmp_path):
    need_module("torch")
    need_module("peft")
    from toolkit.engines.admin_token import read_token_file
    from toolkit.inference.client import PolicyClient
    from toolkit.inference.versions import VERSIONS_PATH, lora_name
    from toolkit.inference.weights import WeightUpdater
    from toolkit.models.resolve import resolve_model
    from toolkit.orchestrator.policy import run_identity
    from toolkit.run.types import SamplingParams

    t0 = time.monotonic()
    out = tmp_path / "out"
    out.mkdir()
    dep = out / "serve"
    serve = _srl(
        "inference",
        "@",
        str(REPO / "jobs/serve/tiny.toml"),
        "--output-dir",
        str(out),
        "--run.name",
        "serve",
        "--trainer.model.lora.rank",
        "8",
        "--inference.vllm.max-loras",
        "2",
        log=tmp_path / "serve.log",
    )
    procs = {"srl inference": (serve, tmp_path / "serve.log")}
    runs = {"a": 1, "b": 2}
    try:
        _until("deployment ready", lambda: RunDir(dep).inference_ready.exists(), procs, 600)
        for name, seed in runs.items():
            log = tmp_path / f"{name}.log"
            procs[name] = (_srl(*_lora_run(out, name, seed, dep), log=log), log)
        # Both runs are held while a full-weight run is refused: each trainer is stopped (SIGSTOP) as soon as its
        # progress record appears, before its first step, so the 3-step runs cannot end and give their tenant
        # leases back before the refusal is looked at; their orchestrators, which hold the leases, renew them.
        held: dict[str, int] = {}

        def trainers_held() -> bool:
            for name in runs:
                rec = heartbeat.read_all(RunDir(out / name)).get("trainer.rank0")
                if name not in held and rec is not None:
                    os.kill(rec["pid"], signal.SIGSTOP)
                    held[name] = rec["pid"]
            return len(held) == len(runs)

        tenants = RunDir(dep).lora_tenants
        try:
            _until("both trainers started", trainers_held, procs, 600, poll_s=0.05)
            _until(
                "both runs hold their LoRA-tenant leases", lambda: len(list(tenants.glob("*.json"))) == 2, procs, 600
            )
            full = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "toolkit.cli",
                    "rl",
                    "@",
                    str(REPO / "jobs/reverse-text/rl.toml"),
                    "--output-dir",
                    str(out),
                    "--run.name",
                    "full",
                    "--inference.external",
                    str(dep),
                    "--max-steps",
                    "2",
                ],
                cwd=REPO,
                check=False,
                capture_output=True,
                text=True,
                timeout=300,
            )
        finally:
            for pid in held.values():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
        assert full.returncode == 2, full.stdout + full.stderr
        assert "serves the LoRA adapter of run" in full.stderr and "srl cancel" in full.stderr, full.stderr
        assert not (out / "full" / "configs").exists()

        for name in runs:
            p, log = procs[name]
            try:
                p.wait(timeout=900)
            except subprocess.TimeoutExpired:
                pytest.fail(f"run {name} did not end within 900 s:\n{log.read_text()[-4000:]}")
            assert p.returncode == 0, log.read_text()[-4000:]
        runs_s = time.monotonic() - t0

        ids = {name: run_identity(RunDir(out / name)) for name in runs}
        assert ids["a"] != ids["b"]
        for name in runs:
            run = out / name
            assert role_steps(run, "trainer") == list(range(1, STEPS + 1))
            reloads = [json.loads(x) for x in (run / "policy_reloads.jsonl").read_text().splitlines()]
            assert {r["version"] for r in reloads} >= {1, 2}, reloads
            assert not [r for r in reloads if r.get("restore")], reloads  # the engine watch saw no restart
            for r in reloads:  # this run's adapter only, at this run's version
                assert r["adapter"] == lora_name(ids[name]), r
                assert set(r["engines"].values()) == {served_version(run, r["version"])}, r
            lines = metrics_lines(run)
            kl = {m["step"]: m["mismatch_kl/mean"] for m in lines if m["role"] == "trainer" and "mismatch_kl/mean" in m}
            print(f"run {name}: mismatch_kl by step {kl}")
            assert all(kl[s] < 1e-3 for s in range(2, STEPS + 1)), kl
            orch = [m for m in lines if m["role"] == "orchestrator" and m["step"] >= 1 and not is_final_eval_line(m)]
            assert orch and all(m["off_policy/foreign_dropped"] == 0 for m in orch), orch
            # Each broadcast is the adapter alone, and the last batch was sampled by this run's own adapter of the
            # step before (the trainer's peft model's logprobs, far from the base model's and so from the other
            # run's adapter, trained with another seed).
            assert_adapter_broadcasts(run, range(1, STEPS + 1))
            gap_own, gap_base, n = assert_serves_adapter(run, batch_step=STEPS, adapter_step=STEPS - 1)
            print(
                f"run {name}: batch {STEPS} vs adapter step {STEPS - 1}: {gap_own:.2e} nats/token, vs base "
                f"{gap_base:.2e}, {n} tokens"
            )
        assert list(tenants.glob("*.json")) == []  # both released the deployment

        # The real engine's record and tags, read by the real client and updater.
        engine = json.loads(RunDir(dep).inference_ready.read_text())["engine_urls"][0]
        token = read_token_file(RunDir(dep).admin_token_file)

        async def probe() -> dict:
            import httpx

            got = {}
            async with httpx.AsyncClient(headers={"X-SRL-Admin-Token": token}) as http:
                got["record"] = (await http.get(engine + VERSIONS_PATH)).json()
            client = PolicyClient(engine, lora_name(ids["a"]), run_id=ids["a"], lora=True)
            sp = SamplingParams(max_tokens=4)
            got["own"] = await client.generate([1, 2, 3], sp, session_id="probe")
            intruder = WeightUpdater([engine], admin_token=token, run_id="intruder")
            await intruder.update(Path(resolve_model("tiny-qwen3")), 1)  # full weights of another run
            got["after"] = await client.generate([1, 2, 3], sp, session_id="probe")
            await client.aclose()
            return got

        got = asyncio.run(probe())
        last = {
            name: max(json.loads(x)["version"] for x in (out / name / "policy_reloads.jsonl").read_text().splitlines())
            for name in runs
        }
        assert got["record"] == {
            "base": "default",
            "adapters": {lora_name(ids[n]): served_version(out / n, last[n]) for n in runs},
        }, got["record"]
        assert got["own"].foreign_version is None and got["own"].policy_version == last["a"]
        assert got["after"].foreign_version == "intruder:1", got["after"]
        print(
            f"two LoRA runs of {STEPS} steps on one deployment: {runs_s:.0f} s from `srl inference` to both ended; "
            f"test {time.monotonic() - t0:.0f} s"
        )
    finally:
        for p, _ in reversed(list(procs.values())):
            _stop(p)
