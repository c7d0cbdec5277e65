"""Elastic inference, the login-node side: what ``[deployment.elastic]`` changes in the plan, the config a replica
job gets, and what ``srl inference join`` refuses before anything is submitted. Joining, serving and leaving on a
real cluster: tests/integration/test_elastic_replicas_slurm.py."""

from __future__ import annotations

import pytest
from golden.layouts import make_cfg

from toolkit.config import ConfigError
from toolkit.inference.weights import WeightUpdater
from toolkit.launch.prepare import prepare_run
from toolkit.launch.replicas import join, replica_config
from toolkit.placement import build_plan
from toolkit.preflight.site import load_site
from toolkit.run.layout import RunDir

PI = load_site("prime-intellect")


def _dep(**kw) -> dict:
    return {"type": "multi_node", "gpus_per_node": 8, "num_train_nodes": 1, **kw}


def _roles(cfg) -> list[str]:
    plan = build_plan(cfg, PI, RunDir(cfg.output_dir / "r"), job_id="7")
    return sorted({p.role for p in plan.processes})


def test_an_elastic_run_has_a_router_even_with_one_engine():
    one_engine = {"vllm": {"tensor_parallel_size": 8}}  # the inference node's 8 GPUs make one engine
    plain = make_cfg(site="prime-intellect", deployment=_dep(), inference=one_engine)
    elastic = make_cfg(
        site="prime-intellect", deployment=_dep(elastic={"partition": "spot", "time": 30}), inference=one_engine
    )
    assert "router" not in _roles(plain)
    assert "router" in _roles(elastic)
    assert elastic.deployment.elastic.time == "30" and elastic.deployment.elastic.max_replicas == 4


def test_a_replica_is_one_inference_island_of_the_run_on_the_elastic_partition(tmp_path):
    cfg = make_cfg(
        site="prime-intellect",
        output_dir=str(tmp_path),
        deployment=_dep(num_infer_replicas=2, elastic={"partition": "spot", "time": "00:45:00", "qos": "low"}),
        slurm={"partition": "gpu", "qos": "normal", "time": "02:00:00"},
    )
    run = RunDir(tmp_path / "r")
    got = replica_config(cfg, run, 3).config
    assert got.deployment.num_infer_replicas == 1 and got.deployment.elastic is None
    assert got.output_dir == run.replicas and got.run.name == "replica-3"
    assert (got.slurm.partition, got.slurm.time, got.slurm.qos) == ("spot", "00:45:00", "low")
    assert got.model.name == cfg.model.name and got.inference.vllm == cfg.inference.vllm
    over = replica_config(cfg, run, 4, partition="debug", time="10").config
    assert (over.slurm.partition, over.slurm.time) == ("debug", "10")
    # without its own partition or QOS, a replica takes the run's
    plain = make_cfg(site="prime-intellect", deployment=_dep(elastic={}), slurm={"partition": "gpu", "qos": "normal"})
    got = replica_config(plain, RunDir(tmp_path / "p"), 1).config
    assert (got.slurm.partition, got.slurm.qos) == ("gpu", "normal")


def _prepared(tmp_path, **kw):
    from toolkit.config import LoadedConfig

    cfg = make_cfg(**{"site": "prime-intellect", "output_dir": str(tmp_path), **kw})
    run, _ = prepare_run(LoadedConfig(cfg), argv=["srl", "rl"])
    return run


def test_join_refuses_a_run_that_cannot_take_replicas_before_submitting_anything(tmp_path):
    with pytest.raises(ConfigError, match="is not an srl rl run directory"):
        join(RunDir(tmp_path / "nothing"), count=1, partition=None, time=None, argv=[])
    run = _prepared(tmp_path, deployment=_dep())
    with pytest.raises(ConfigError, match=r"deployment.elastic: .* was not started with \[deployment.elastic\]"):
        join(run, count=1, partition=None, time=None, argv=[])
    run = _prepared(tmp_path / "el", deployment=_dep(elastic={"max_replicas": 2}))
    with pytest.raises(ConfigError, match="--count 3: the run has 0 replica job"):
        join(run, count=3, partition=None, time=None, argv=[])
    with pytest.raises(ConfigError, match="--count: at least 1"):
        join(run, count=0, partition=None, time=None, argv=[])
    assert not run.replicas.exists()


def test_a_joined_engine_is_updated_with_its_own_admin_token():
    up = WeightUpdater(["http://a:1"], admin_token="run-token")
    up.add_engine("http://b:2/", "replica-token")
    assert up.engine_urls == ["http://a:1", "http://b:2"]
    seen: dict[str, str | None] = {}

    class Recorder:
        async def request(self, method, url, **kw):
            seen[url] = (kw.get("headers") or {}).get("X-SRL-Admin-Token")

            class R:
                status_code = 200

            return R()

    import asyncio

    asyncio.run(up._all(Recorder(), "/resume"))
    # the run's engine keeps the client's token (None here: set on the client itself); the replica carries its own
    assert seen == {"http://a:1/resume": None, "http://b:2/resume": "replica-token"}
    up.remove_engine("http://b:2")
    assert up.engine_urls == ["http://a:1"]


def test_replicas_submitted_with_the_run_stay_within_max_replicas():
    with pytest.raises(ConfigError, match=r"replicas \(3\) exceeds max_replicas \(2\)"):
        make_cfg(site="prime-intellect", deployment=_dep(elastic={"replicas": 3, "max_replicas": 2}))
    assert make_cfg(site="prime-intellect", deployment=_dep(elastic={"replicas": 2})).deployment.elastic.replicas == 2


def test_a_replica_time_limit_is_checked_where_it_is_given(tmp_path):
    with pytest.raises(ConfigError, match="deployment.elastic.time"):
        make_cfg(site="prime-intellect", deployment=_dep(elastic={"time": "soon"}))
    with pytest.raises(ConfigError, match=r"deployment.elastic.time.*must exceed slurm.signal_lead_s \(600 s\)"):
        make_cfg(site="prime-intellect", deployment=_dep(elastic={"time": "00:05:00"}))
    run = _prepared(tmp_path, deployment=_dep(elastic={}))
    with pytest.raises(ConfigError, match="--time: "):
        join(run, count=1, partition=None, time="tomorrow", argv=[])
