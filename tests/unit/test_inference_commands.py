"""Engine/router command and env builders, P/D layouts (field case B08), readiness files, metrics parsing."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from local_engines import cpu_binds
from prereqs import need_module

from toolkit.engines.commands import (
    CommandError,
    engine_command,
    engine_env,
    router_command,
    vllm_arg_list,
)
from toolkit.engines.metrics import parse_metric
from toolkit.run.layout import RunDir

BASE = {
    "model_path": "/m",
    "host": "10.0.0.1",
    "port": 8000,
    "tp": 1,
    "dp": 1,
    "served_model_name": "pol",
    "kv_role": None,
    "kv_connector": None,
    "kv_extra": None,
    "python": "/py",
}


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_vllm_arg_list_rendering():
    got = vllm_arg_list(
        {
            "max_model_len": 2048,
            "enable-prefix-caching": True,
            "enforce_eager": False,
            "x": None,
            "compilation_config": {"b": 1, "a": 2},
            "middleware": ["m1", "m2"],
        }
    )
    assert got == [
        "--max-model-len",
        "2048",
        "--enable-prefix-caching",
        "--compilation-config",
        '{"a":2,"b":1}',
        "--middleware",
        "m1",
        "--middleware",
        "m2",
    ]


def test_false_switches_off_an_option_vllm_may_switch_on_itself():
    # leaving such an option out keeps vLLM's "on": the user's "off" must be spelled --no-<option>
    got = vllm_arg_list({"enable_prefix_caching": False, "enable-chunked-prefill": False, "enforce_eager": False})
    assert got == ["--no-enable-prefix-caching", "--no-enable-chunked-prefill"]
    assert vllm_arg_list({"enable_chunked_prefill": True}) == ["--enable-chunked-prefill"]


def test_engine_command_plan_values_and_user_override_of_defaults():
    argv = engine_command(
        **BASE,
        vllm_args={"enforce_eager": False, "max_num_seqs": 8},
        defaults={"enforce_eager": True, "max_logprobs": 20},
    )
    assert argv[:3] == ["/py", "-m", "vllm.entrypoints.openai.api_server"]
    assert "--enforce-eager" not in argv  # the user switched the default off
    assert _flag(argv, "--max-num-seqs") == "8" and _flag(argv, "--max-logprobs") == "20"
    assert _flag(argv, "--model") == "/m" and _flag(argv, "--host") == "10.0.0.1"
    assert _flag(argv, "--port") == "8000" and _flag(argv, "--served-model-name") == "pol"
    assert _flag(argv, "--tensor-parallel-size") == "1" and "--kv-transfer-config" not in argv


@pytest.mark.parametrize(
    "key", ["port", "tensor-parallel-size", "tp", "model", "served_model_name", "kv_transfer_config", "--host"]
)
def test_engine_command_refuses_plan_owned_keys(key):
    with pytest.raises(CommandError, match=key.lstrip("-")):
        engine_command(**BASE, vllm_args={key: "x"})


def test_kv_transfer_config_roles_and_connectors():
    argv = engine_command(
        **{
            **BASE,
            "kv_role": "kv_consumer",
            "kv_connector": "ExampleConnector",
            "kv_extra": {"shared_storage_path": "/s"},
        },
        vllm_args={},
    )
    cfg = json.loads(_flag(argv, "--kv-transfer-config"))
    assert cfg == {
        "kv_connector": "ExampleConnector",
        "kv_role": "kv_consumer",
        "kv_connector_extra_config": {"shared_storage_path": "/s"},
    }
    with pytest.raises(CommandError, match="shared_storage_path"):
        engine_command(**{**BASE, "kv_role": "kv_producer", "kv_connector": "ExampleConnector"}, vllm_args={})
    with pytest.raises(CommandError, match="kv_role"):
        engine_command(**{**BASE, "kv_role": "producer", "kv_connector": "NixlConnector"}, vllm_args={})
    argv = engine_command(
        **{**BASE, "kv_role": "kv_producer", "kv_connector": "NixlConnector", "kv_extra": {"kv_buffer_device": "cpu"}},
        vllm_args={},
    )
    assert json.loads(_flag(argv, "--kv-transfer-config")) == {
        "kv_connector": "NixlConnector",
        "kv_role": "kv_producer",
        "kv_buffer_device": "cpu",
    }


def test_engine_env_cpu_and_nixl():
    env = engine_env(
        role="engine", omp_bind="1", side_channel_host=None, side_channel_port=None, cpu=True, user_env={"FOO": "1"}
    )
    assert env == {
        "VLLM_SERVER_DEV_MODE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_OMP_THREADS_BIND": "1",
        "FOO": "1",
    }
    # a CPU engine of several workers (tp x dp > 1) keeps vLLM's worker processes, which it needs for its ranks
    env = engine_env(
        role="engine", omp_bind=None, side_channel_host=None, side_channel_port=None, cpu=True, user_env={}, workers=2
    )
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in env
    env = engine_env(
        role="prefill",
        omp_bind=None,
        side_channel_host="10.1.2.3",
        side_channel_port=5601,
        cpu=False,
        user_env={"UCX_TLS": "rc,cuda_copy"},
    )
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.1.2.3" and env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5601"
    assert "VLLM_CPU_KVCACHE_SPACE" not in env and env["UCX_TLS"] == "rc,cuda_copy"


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "0.0.0.0", "::1"])
def test_engine_env_refuses_unroutable_side_channel_host(host):  # field case B08
    with pytest.raises(CommandError, match="not routable from other nodes"):
        engine_env(role="decode", omp_bind=None, side_channel_host=host, side_channel_port=5600, cpu=False, user_env={})


def test_engine_env_refuses_plan_owned_user_env():
    with pytest.raises(CommandError, match="VLLM_NIXL_SIDE_CHANNEL_HOST"):
        engine_env(
            role="decode",
            omp_bind=None,
            side_channel_host="10.0.0.2",
            side_channel_port=5600,
            cpu=False,
            user_env={"VLLM_NIXL_SIDE_CHANNEL_HOST": "localhost"},
        )


def test_router_command_aggregated_and_pd():
    argv = router_command(
        host="0.0.0.0",
        port=9000,
        engine_urls=["http://a:1", "http://b:2"],
        policy="sticky_least_loaded",
        request_timeout_s=300,
        health_check_interval_s=5,
    )
    assert argv[0] == "vllm-router" and _flag(argv, "--policy") == "sticky_least_loaded"
    assert argv[argv.index("--worker-urls") + 1 : argv.index("--worker-urls") + 3] == [
        "http://a:1",
        "http://b:2",
    ]
    assert _flag(argv, "--request-timeout-secs") == "300"
    argv = router_command(
        host="h",
        port=1,
        engine_urls=[],
        policy="round_robin",
        request_timeout_s=60,
        prefill_urls=["http://p:1", "http://p:2"],
        decode_urls=["http://d:1"],
    )
    assert "--vllm-pd-disaggregation" in argv and "--worker-urls" not in argv
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--prefill"] == ["http://p:1", "http://p:2"]
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--decode"] == ["http://d:1"]
    with pytest.raises(CommandError):
        router_command(
            host="h",
            port=1,
            engine_urls=[],
            policy="random",
            request_timeout_s=1,
            prefill_urls=["http://p:1"],
            decode_urls=[],
        )


def test_router_command_parses_with_the_real_router_cli():
    """vllm-router's own argument parser accepts what we render (fails if a flag is renamed upstream)."""
    need_module("vllm_router")
    code = (
        "import sys; from vllm_router.launch_router import parse_router_args; "
        "a = parse_router_args(sys.argv[1:]); print(a.policy, a.request_timeout_secs, a.vllm_pd_disaggregation)"
    )
    argv = router_command(
        host="127.0.0.1",
        port=9000,
        engine_urls=[],
        policy="sticky_least_loaded",
        request_timeout_s=120,
        prefill_urls=["http://p:1"],
        decode_urls=["http://d:1"],
    )
    out = subprocess.run(
        [sys.executable, "-c", code, *argv[1:]], capture_output=True, text=True, timeout=30, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["sticky_least_loaded", "120", "True"]


def test_cpu_binds_are_disjoint():
    assert cpu_binds(2, 2) == ["0", "1"] and cpu_binds(1, 2) == [None] and cpu_binds(2, 8) == ["0-3", "4-7"]
    with pytest.raises(ValueError):
        cpu_binds(3, 2)


def test_parse_metric_sums_label_sets():
    text = (
        '# HELP vllm:num_requests_waiting x\nvllm:num_requests_waiting{engine="0"} 3.0\n'
        'vllm:num_requests_waiting{engine="1"} 2.0\nvllm:num_requests_waiting_by_reason{r="c"} 9.0\n'
    )
    assert parse_metric(text, "vllm:num_requests_waiting") == 5.0
    assert parse_metric(text, "vllm:num_requests_running") is None


def test_ready_file_roundtrip_and_timeout(tmp_path):
    from toolkit.engines.health import clear_ready, read_ready, write_ready

    run = RunDir(tmp_path / "run")
    with pytest.raises(TimeoutError, match="inference_ready"):
        read_ready(run, timeout_s=0.2, interval_s=0.05)
    write_ready(run, {"base_url": "http://h:1", "engine_urls": ["http://h:1"]})
    assert read_ready(run, timeout_s=1)["base_url"] == "http://h:1"
    clear_ready(run)
    assert not run.inference_ready.exists()


def test_run_queue_depths_groups_by_role_and_reports_unreachable(tmp_path):
    from local_engines import free_port

    from toolkit.engines.health import write_ready
    from toolkit.inference.queues import run_queue_depths

    run = RunDir(tmp_path / "run")
    p, d = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
    write_ready(run, {"engine_urls": [p, d], "roles": {p: "prefill", d: "decode"}})
    got = run_queue_depths(run, timeout_s=1)
    assert set(got) == {"prefill", "decode", "advice"}
    assert got["prefill"]["engines"][p]["waiting"] is None and "error" in got["prefill"]["engines"][p]


def test_read_ready_returns_none_on_a_stop_request(tmp_path):
    from toolkit.engines.health import read_ready

    t0 = time.monotonic()
    assert read_ready(RunDir(tmp_path / "run"), timeout_s=60, interval_s=0.05, should_stop=lambda: True) is None
    assert time.monotonic() - t0 < 5
