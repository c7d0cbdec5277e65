"""A prefill/decode layout's inference node count is derived when left out; a contradicting one is an error."""

from __future__ import annotations

import pytest
from golden.layouts import make_cfg

from toolkit.config import ConfigError
from toolkit.placement import build_plan
from toolkit.preflight.site import load_site
from toolkit.run.layout import RunDir

PD = {
    "type": "disaggregated",
    "num_prefill_replicas": 1,
    "prefill_nodes_per_replica": 1,
    "num_decode_replicas": 2,
    "decode_nodes_per_replica": 1,
}


def _dep(**kw) -> dict:
    return {"type": "multi_node", "gpus_per_node": 8, "num_train_nodes": 2, **kw}


def test_pd_layout_derives_num_infer_nodes_when_not_given(tmp_path) -> None:
    cfg = make_cfg(
        {"run": {"name": "pd"}, "deployment": _dep(num_infer_replicas=2), "inference": {"deployment": PD}},
        site="prime-intellect",
    )
    assert cfg.deployment.num_infer_nodes == 6  # (1 prefill + 2 decode nodes) x 2 islands
    plan = build_plan(cfg, load_site("prime-intellect"), RunDir(tmp_path / "pd"), job_id="1")
    assert plan.num_nodes == 8
    assert {p.name: p.node_indices for p in plan.processes}["trainer"] == (6, 7)
    # The resolved value loads back as the same config (what `srl config show` prints).
    again = make_cfg(
        {
            "run": {"name": "pd"},
            "deployment": _dep(num_infer_replicas=2, num_infer_nodes=6),
            "inference": {"deployment": PD},
        },
        site="prime-intellect",
    )
    assert again == cfg


def test_pd_layout_with_a_contradicting_num_infer_nodes_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"num_infer_nodes = 2, but .* implies 3 node\(s\) per replica"):
        make_cfg(
            {"run": {"name": "pd"}, "deployment": _dep(num_infer_nodes=2), "inference": {"deployment": PD}},
            site="prime-intellect",
        )


def test_single_engine_inference_still_takes_one_node_per_replica() -> None:
    cfg = make_cfg({"run": {"name": "one"}, "deployment": _dep(num_infer_replicas=3)}, site="prime-intellect")
    assert cfg.deployment.num_infer_nodes == 3
