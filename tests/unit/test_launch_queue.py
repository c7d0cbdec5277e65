"""Queue-aware placement (toolkit.launch.queue): the shapes offered, Slurm's answer parsed, the soonest chosen, and
the flag refused where it means nothing. Slurm's own answers are checked on the local cluster
(tests/integration/test_queue_estimates_slurm.py)."""

from __future__ import annotations

from datetime import datetime

import pytest
from golden.layouts import make_cfg

from toolkit.config import ConfigError
from toolkit.config.cli_args import split_config_args
from toolkit.launch.queue import Estimate, choose_soonest, parse_test_only, shapes, soonest
from toolkit.preflight.site import load_site
from toolkit.run.layout import RunDir


def _multi(replicas: int, **dep) -> dict:
    return {
        "type": "multi_node",
        "gpus_per_node": 8,
        "num_train_nodes": 2,
        "num_infer_replicas": replicas,
        **dep,
    }


def test_parse_test_only_reads_slurms_answer():
    text = "sbatch: Job 1234 to start at 2026-12-06T07:30:05 using 6 processors on nodes node[1-3] in partition debug\n"
    assert parse_test_only(text) == (datetime(2026, 12, 6, 7, 30, 5), "node[1-3]", "debug")
    assert parse_test_only("sbatch: Job 7 to start at 2026-12-06T07:30:05 using 2 processors on nodes n1") == (
        datetime(2026, 12, 6, 7, 30, 5),
        "n1",
        None,
    )
    for refusal in ("sbatch: error: Batch job submission failed: Requested node configuration is not available", ""):
        assert parse_test_only(refusal) is None


def test_a_single_allocation_or_one_replica_has_only_its_own_shape():
    single = make_cfg(site="prime-intellect")
    assert [(s.replicas, s.configured) for s in shapes(single)] == [(1, True)]
    one = make_cfg(site="prime-intellect", deployment=_multi(1))
    assert [(s.replicas, s.nodes) for s in shapes(one)] == [(1, 3)]


def test_smaller_shapes_drop_inference_replicas_and_their_nodes():
    cfg = make_cfg(site="prime-intellect", deployment=_multi(2))
    assert [(s.replicas, s.nodes, s.configured) for s in shapes(cfg)] == [(2, 4, True), (1, 3, False)]
    big = make_cfg(site="prime-intellect", deployment=_multi(8, orchestrator="own_node"))
    got = shapes(big)
    assert [(s.replicas, s.nodes) for s in got] == [(8, 11), (7, 10), (4, 7), (1, 4)]
    # each variant is a whole, valid run config whose only change is the replica count and the nodes it implies
    for s in got[1:]:
        assert s.config.deployment.num_infer_replicas == s.replicas
        assert s.config.deployment.num_infer_nodes == s.replicas
        assert s.config.deployment.num_train_nodes == 2 and s.config.run == big.run


def test_disaggregated_replicas_and_an_explicit_node_count_follow():
    pd = {
        "type": "disaggregated",
        "num_prefill_replicas": 1,
        "num_decode_replicas": 1,
        "prefill_nodes_per_replica": 1,
        "decode_nodes_per_replica": 1,
    }
    cfg = make_cfg(site="prime-intellect", deployment=_multi(3, nodes=8), inference={"deployment": pd})
    got = shapes(cfg)
    assert [(s.replicas, s.nodes) for s in got] == [(3, 8), (2, 6), (1, 4)]
    assert [s.config.deployment.nodes for s in got] == [8, 6, 4]
    assert [s.config.deployment.num_infer_nodes for s in got] == [6, 4, 2]


def test_soonest_start_wins_and_a_tie_goes_to_more_replicas():
    cfg = make_cfg(site="prime-intellect", deployment=_multi(4))
    big, three, two, one = shapes(cfg)
    t0, t1 = datetime(2026, 12, 6, 7, 0), datetime(2026, 12, 6, 9, 0)
    found = [
        Estimate(big, t1, "n[1-6]"),
        Estimate(three, t0, "n[1-5]"),
        Estimate(two, t0, "n[1-4]"),
        Estimate(one, None, reason="x"),
    ]
    assert soonest(found).shape is three
    assert soonest([Estimate(big, None, reason="refused"), Estimate(one, None, reason="refused")]) is None
    line = Estimate(one, None, reason="Requested node configuration is not available").line(t0)
    assert "3 node(s), 1 inference replica(s): Slurm gives no start time (Requested node" in line
    assert "starts now" in Estimate(big, t0, "n[1-6]", "debug").line(t0)
    assert "starts in 2 h 00 min" in Estimate(big, t1, "n[1-6]", "debug").line(t0)
    assert "the config's shape" in big.label() and "the config's shape" not in one.label()


def test_start_soonest_is_an_option_of_srl_rl_only(tmp_path):
    files, _, flags = split_config_args(["@", "a.toml", "--start-soonest"], start_soonest=True)
    assert flags["start_soonest"] and files
    with pytest.raises(ConfigError, match="--start-soonest is an option of srl rl only"):
        split_config_args(["@", "a.toml", "--start-soonest"])


def test_start_soonest_on_a_site_without_slurm_is_refused_before_anything_is_written(tmp_path):
    from toolkit.config import LoadedConfig

    cfg = make_cfg(site="local", output_dir=str(tmp_path))
    with pytest.raises(ConfigError, match="site 'local' has no Slurm"):
        choose_soonest(LoadedConfig(cfg), load_site("local"), RunDir(tmp_path / "r"), roles=("inference",))
    assert list(tmp_path.iterdir()) == []
