"""Node-side resolve on a job whose nodes share this machine's address (the local Slurm test cluster): ports that
something already listens on are never handed to the job's engines (toolkit.placement.runtime.resolve)."""

from __future__ import annotations

import socket
from pathlib import Path

from toolkit.config import load_config
from toolkit.launch.prepare import prepare_run
from toolkit.placement import build_plan, read_plan, runtime, write_plan
from toolkit.preflight.site import load_site

JOBS = Path(__file__).resolve().parents[2] / "jobs" / "reverse-text"


def test_resolve_on_one_machine_moves_off_a_busy_port_block(tmp_path: Path, monkeypatch) -> None:
    # Emulated nodes share 127.0.0.1: a port of this job's block already listened on (another job, a local run)
    # would stop the engine from starting, so the node-side resolve takes the next free block.
    loaded = load_config(
        [JOBS / "rl.toml", JOBS / "slurm.toml"], ["--output-dir", str(tmp_path), "--run.name", "ports"]
    )
    run, _ = prepare_run(loaded, argv=["srl", "rl"])
    site = load_site("local-slurm")
    write_plan(run, build_plan(loaded.config, site, run, job_id="$SLURM_JOB_ID"))
    busy_port = build_plan(loaded.config, site, run, job_id="4242").ports["inference-0-0.http"]
    monkeypatch.setattr(runtime, "node_addresses", lambda hosts: ["127.0.0.1"] * len(hosts))
    env = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "node[1-3]"}
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", busy_port))
        s.listen()
        plan = runtime.resolve(run, *runtime.job_config(run, None), env)
    assert busy_port not in plan.ports.values()
    assert plan.job_id == "4242" and read_plan(run).ports == plan.ports
    free = runtime.resolve(run, *runtime.job_config(run, None), env)  # nothing listens any more: the job id's own block
    assert free.ports["inference-0-0.http"] == busy_port
