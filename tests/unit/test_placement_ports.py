"""Ports: property test over many job ids and layouts, plus the site range rules."""

from __future__ import annotations

import itertools

import pytest
from golden.layouts import make_cfg, multi
from hypothesis import given, settings
from hypothesis import strategies as st

from toolkit.config.site import FORBIDDEN_PORTS, PortsSection, SiteConfig
from toolkit.placement import build_plan
from toolkit.placement.ports import PortAllocator, PortError, job_key
from toolkit.preflight.site import ephemeral_port_range, site_findings
from toolkit.run.layout import RunDir

EPHEMERAL = ephemeral_port_range()

_LAYOUTS = [
    {
        "deployment": {"type": "single_node", "gpus_per_node": 8, "num_infer_gpus": 4, "num_train_gpus": 4},
        "inference": {"deployment": {"type": "single_node", "num_replicas": 4}},
    },
    {"deployment": multi(2, 2, num_infer_replicas=2), "inference": {"vllm": {"tensor_parallel_size": 1}}},
    {
        "deployment": multi(1, 4, num_infer_replicas=2),
        "inference": {
            "vllm": {"tensor_parallel_size": 2},
            "deployment": {"type": "disaggregated", "kv_connector": "NixlConnector", "num_decode_replicas": 1},
        },
    },
]
_CFGS = [make_cfg(dict(over, run={"name": f"p{i}"}), site="prime-intellect") for i, over in enumerate(_LAYOUTS)]


def _site(lo: int, hi: int, shared: bool) -> SiteConfig:
    return SiteConfig(name="prop", ports=PortsSection(range_start=lo, range_end=hi, nodes_share_network=shared))


@settings(max_examples=150, deadline=None)
@given(
    job=st.one_of(st.integers(1, 10**9), st.text(min_size=1, max_size=12)),
    layout=st.integers(0, len(_CFGS) - 1),
    lo=st.integers(1024, 20000),
    width=st.integers(512, 12000),
    shared=st.booleans(),
)
def test_ports_in_range_distinct_and_outside_ephemeral(job, layout, lo, width, shared) -> None:
    hi = min(lo + width, EPHEMERAL[0])
    site = _site(lo, hi, shared)
    plan = build_plan(_CFGS[layout], site, RunDir("/shared/runs/x"), job_id=job)
    ports = list(plan.ports.values())
    assert all(lo <= p < hi for p in ports)
    assert not set(ports) & FORBIDDEN_PORTS
    assert all(not EPHEMERAL[0] <= p <= EPHEMERAL[1] for p in ports)
    # distinct per host (or job-wide when nodes share one network namespace)
    seen: dict[tuple[int, int], str] = {}
    for p in plan.processes:
        width_of = {"side_channel": max(1, len(p.gpus))}
        for name, port in p.ports.items():
            for q in range(port, port + width_of.get(name, 1)):
                key = (0 if shared else p.node_index, q)
                assert key not in seen, f"{p.name}.{name} and {seen[key]} share port {q}"
                seen[key] = f"{p.name}.{name}"


def test_a_job_id_of_other_unicode_digits_gets_a_block() -> None:
    assert job_key("²") == job_key("²") and job_key("12_3") == 12  # found by the property test above


def test_consecutive_jobs_get_disjoint_blocks() -> None:
    cfg = _CFGS[1]
    site = _site(20000, 30000, False)
    plans = [build_plan(cfg, site, RunDir("/r"), job_id=j) for j in range(5000, 5010)]
    for a, b in itertools.pairwise(plans):
        assert set(a.ports.values()).isdisjoint(b.ports.values())


def test_job_key_uses_numeric_ids_and_array_heads() -> None:
    assert job_key("1234") == 1234 and job_key("77_3") == 77 and job_key("12+1") == 12
    assert job_key("local") == job_key("local") != job_key("other")


def test_block_never_contains_a_framework_default() -> None:
    alloc = PortAllocator(7990, 8100)
    alloc.request(0, "a", 20)
    ports = alloc.assign(0)
    assert not alloc.base <= 8000 < alloc.base + alloc.block_size
    assert ports["a"] == alloc.base


def test_range_too_small_is_an_error() -> None:
    alloc = PortAllocator(20000, 20064)
    alloc.request(0, "many", 100)
    with pytest.raises(PortError, match="needs 112 ports on one host but the site's port range"):
        alloc.assign(1)


def test_site_range_overlapping_ephemeral_is_an_error() -> None:
    site = _site(30000, 40000, False)
    f = site_findings(site, ephemeral=(32768, 60999))
    assert any("overlaps the kernel's ephemeral range [32768, 60999]" in e.message for e in f.errors)
    assert not site_findings(_site(20000, 30000, False), ephemeral=(32768, 60999)).errors
