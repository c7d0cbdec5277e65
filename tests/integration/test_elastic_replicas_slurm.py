"""Elastic inference on the real local Slurm cluster: the README's RL job (real vLLM engine behind vllm-router,
orchestrator, torchrun trainer) with ``[deployment.elastic]`` gains a replica job mid-run through
``srl inference join`` on a preemptible partition, serves rollouts on it, loses it to preemption, gets it back
when Slurm requeues it, then loses it to ``scancel`` while rollouts are in flight.

Checks, each on what the product records:
- the replica joins only holding the run's current policy: its join event names a version >= 1, its engine's
  ``/weight_info`` names this run's version (never the base model's), and the router lists it;
- the router sends it requests (its engine's own generated-token counter grows);
- preempted (a debug job needs its cores; the replica runs on the lower-tier "preemptible" partition), it
  leaves; Slurm requeues its job, which joins again with the run's current policy and serves;
- after ``scancel`` the orchestrator records its leave, the run keeps stepping, every trainer and orchestrator step
  is recorded exactly once, and mismatch_kl stays at float noise; the requests the leaving engine held are
  counted (``inference/lost_requests``) and no rollout errored (vllm-router retries a failed request on another
  worker itself, so the client's own retries are often none);
- ending the run leaves no replica job in Slurm and no process of the run or the replica on the machine.
"""

from __future__ import annotations

import json
import statistics
import time

import httpx
import pytest
from run_records import metrics_lines, processes_left, role_steps, srl_run, submit_slurm_rl
from slurm_cluster import CPUS_PER_NODE, submit_sleeper

from toolkit.engines.admin_token import admin_headers, read_token_file
from toolkit.engines.metrics import parse_metric
from toolkit.launch import slurm
from toolkit.launch.submit import read_job_ids
from toolkit.run import ending
from toolkit.run.control import request_stop
from toolkit.run.layout import RunDir

pytestmark = [pytest.mark.slow, pytest.mark.slurm, pytest.mark.vllm]

# Bounds of the waits below: engine start-ups and steps on two cores shared by four emulated nodes. A bound only
# ends a wait that would otherwise never end; every wait is for an event the run records.
WAIT_S = 600.0


def _wait(what: str, check, timeout_s: float = WAIT_S, *, run: RunDir | None = None):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(1.0)
    logs = ""
    if run is not None:
        logs = "\n".join(
            p.read_text()[-3000:] for p in sorted(run.logs.rglob("*.log")) + sorted(run.logs.glob("*.out"))
        )
    raise AssertionError(f"not seen within {timeout_s:g} s: {what}\n{logs}")


def _events(run: RunDir) -> list[dict]:
    try:
        return [json.loads(line) for line in run.replica_events.read_text().splitlines() if line.strip()]
    except OSError:
        return []


def _of(run: RunDir, kind: str) -> list[dict]:
    return [e for e in _events(run) if e["event"] == kind]


def _submit_preemptor(node: str, cpus: int) -> str:
    """A debug-partition job that needs ``cpus`` cores of ``node``: Slurm requeues the preemptible jobs there."""
    return submit_sleeper(
        "--partition=debug",
        f"--nodelist={node}",
        "--ntasks=1",
        f"--cpus-per-task={cpus}",
        "--time=10",
        job_name="srl-preemptor",
    )


def _steps(run: RunDir, role: str) -> list[int]:
    return role_steps(run.root, role, first=1)


def _replicas_recorded(run: RunDir, count: int) -> bool:
    """Whether an orchestrator step has recorded ``count`` replica engines serving (``inference/replicas``)."""
    return any(m.get("inference/replicas") == count for m in metrics_lines(run.root) if m.get("role") == "orchestrator")


def _generated_tokens(url: str) -> float:
    try:
        return parse_metric(httpx.get(f"{url}/metrics", timeout=30).text, "vllm:generation_tokens_total") or 0.0
    except httpx.HTTPError:
        return 0.0


def test_a_replica_joins_serves_and_leaves_a_running_run(tmp_path, slurm_cluster):
    run, job = submit_slurm_rl(
        tmp_path,
        "elastic",
        "--max-steps",
        "5000",
        "--orchestrator.eval.interval",
        "5000",
        "--deployment.num-train-nodes",
        "1",
        "--deployment.elastic.max-replicas",
        "2",
        "--deployment.elastic.partition",
        "preemptible",
    )
    replica_jobs: list[str] = []
    try:
        _wait("the run's step 2", lambda: 2 in _steps(run, "orchestrator"), run=run)
        proc = srl_run("inference", "join", str(run.root))
        replica = run.replica_run(1)
        replica_jobs = [j for j, _, _ in read_job_ids(replica)]
        assert len(replica_jobs) == 1, proc.stdout + proc.stderr

        join = _wait("the replica's join", lambda: [e for e in _events(run) if e["event"] == "join"], run=run)[0]
        url = join["url"]
        started = slurm.job_state(replica_jobs[0]).start_time
        join_s = join["time"] - started.timestamp() if started else float("nan")
        assert join["version"] >= 1, join  # it joined holding a trained policy, not the base model
        ready = json.loads(run.inference_ready.read_text())
        workers = httpx.get(f"{ready['router_url']}/list_workers", timeout=30).json()["urls"]
        assert url in workers, workers
        token = read_token_file(replica.admin_token_file)
        served = httpx.get(f"{url}/weight_info", headers=admin_headers(token), timeout=30).json()["weight_version"]
        assert served.split(":")[-1].isdigit() and int(served.split(":")[-1]) >= 1, served
        assert served.split(":")[0] == json.loads(run.run_meta.read_text())["run_id"], served
        _wait("requests served by the replica", lambda: _generated_tokens(url) > 0, run=run)
        # The replica count is a gauge the orchestrator records at the end of each step; a step must end while the
        # replica serves before it is taken away, or no step would have recorded it (slow steps on a busy machine).
        _wait("a step recorded with the replica serving", lambda: _replicas_recorded(run, 1), run=run)

        # Preemption: a debug job that needs the replica's cores makes Slurm requeue the replica job (the
        # "preemptible" partition is a lower priority tier); its engine leaves, and the requeued job joins again.
        node = slurm.job_state(replica_jobs[0]).node_list[0]
        held_by_run = 1 if node in slurm.job_state(job).node_list else 0  # the run's job holds 1 core per node
        preemptor = _submit_preemptor(node, CPUS_PER_NODE - held_by_run)
        try:
            preempted = _wait("the preempted replica's leave", lambda: _of(run, "leave"), run=run)[0]
            assert preempted["url"] == url, preempted
            _wait("the replica job requeued", lambda: slurm.job_state(replica_jobs[0]).restart_count >= 1)
        finally:
            slurm.cancel(preemptor)
        rejoin = _wait("the requeued replica's join", lambda: _of(run, "join")[1:], run=run)[0]
        assert rejoin["replica"] == join["replica"] and rejoin["version"] >= join["version"], (join, rejoin)
        url = rejoin["url"]
        served = httpx.get(f"{url}/weight_info", headers=admin_headers(token), timeout=30).json()["weight_version"]
        assert int(served.split(":")[-1]) >= rejoin["version"] >= 1, served
        _wait("requests served by the rejoined replica", lambda: _generated_tokens(url) > 0, run=run)

        left_at = max(_steps(run, "orchestrator"))
        slurm.cancel(replica_jobs[0])
        leave = _wait("the replica's leave after scancel", lambda: _of(run, "leave")[1:], run=run)[0]
        assert leave["url"] == url, leave
        _wait("three steps after the replica left", lambda: max(_steps(run, "orchestrator")) >= left_at + 3, run=run)
        assert slurm.job_state(job).state == "RUNNING"
        request_stop(run, "test: enough steps")  # recorded as a stop criterion: the job's exit status is 5
        state = slurm.wait(job, timeout_s=WAIT_S, poll_s=2.0)
        end = ending.read(run)
        assert end is not None and end.reason == "test: enough steps" and state.exit_code == 5, (state, end)
    finally:
        slurm.cancel(job)
        for j in replica_jobs:
            slurm.cancel(j)
    for role in ("trainer", "orchestrator"):
        steps = _steps(run, role)
        assert steps == list(range(1, len(steps) + 1)), (role, steps)  # each step once, none skipped
    kls = [m["mismatch_kl/mean"] for m in metrics_lines(run.root) if "mismatch_kl/mean" in m]
    assert kls and max(kls) < 1e-3, kls
    orch = [m for m in metrics_lines(run.root) if m["role"] == "orchestrator" and "inference/replicas" in m]
    assert max(m["inference/replicas"] for m in orch) == 1 and orch[-1]["inference/replicas"] == 0
    # the requests each leaving engine held (last seen) are counted, and none of them failed a rollout: the
    # router sent them to the run's own engine
    held = [e["requests_held"] for e in _of(run, "leave")]
    assert len(held) == 2 and all(isinstance(h, int) and h >= 0 for h in held), held
    assert orch[-1]["inference/lost_requests"] == sum(held), (orch[-1], held)
    assert sum(m["errored_rollouts"] for m in orch) == 0

    # Rollout rate with the replica serving vs without it (the steps before it joined, after the first ten); on two
    # shared cores a second engine adds no compute, so the ratio says what the routing costs, not what it gains.
    def rate(ms):
        return statistics.mean(m["effective_batch_size"] / m["time/step"] for m in ms) if ms else float("nan")

    with_one = [m for m in orch if m["inference/replicas"] == 1]
    without = [m for m in orch if m["inference/replicas"] == 0 and 10 < m["step"] < (with_one or orch)[0]["step"]]
    print(
        f"\n[figure] replica job start -> joined (policy {join['version']} loaded, router updated): {join_s:.1f} s; "
        f"rollouts/s with the replica {rate(with_one):.1f} ({len(with_one)} steps) vs without "
        f"{rate(without):.1f} ({len(without)} steps), ratio {rate(with_one) / rate(without):.2f}; preempted -> "
        f"rejoined (requeued job, policy {rejoin['version']}): {rejoin['time'] - preempted['time']:.1f} s; "
        f"requests held by the leaving engine {held}, sent again by the client "
        f"{sum(m['inference/retried_requests'] for m in orch):.0f}; "
        f"steps {len(_steps(run, 'trainer'))}"
    )
    assert slurm.live_jobs(replica_jobs) == []
    assert processes_left(run.root) == []
