"""srl's vLLM worker extension, the parts that run without an engine, and the updater's choice of reload method."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import pytest

from toolkit.engines import commands
from toolkit.inference.weights import WeightUpdateError, _extension_answer, _has_extension
from toolkit.inference.worker_ext import (
    EXTENSION_CLS,
    RELOAD_METHOD,
    RESULT_MARKER,
    SrlWorkerExtension,
    _ReadAhead,
    weight_files,
)


def test_engine_defaults_load_the_extension():
    assert commands.ENGINE_DEFAULTS["worker_extension_cls"] == EXTENSION_CLS == commands.WORKER_EXTENSION_CLS
    module, _, cls = EXTENSION_CLS.rpartition(".")  # the path vLLM imports names the class itself
    assert getattr(__import__(module, fromlist=[cls]), cls) is SrlWorkerExtension
    argv = commands.engine_command(
        model_path="/m",
        host="127.0.0.1",
        port=8000,
        vllm_args={},
        tp=1,
        dp=1,
        served_model_name="m",
        kv_role=None,
        kv_connector=None,
        kv_extra=None,
        defaults=commands.ENGINE_DEFAULTS,
    )
    assert argv[argv.index("--worker-extension-cls") + 1] == EXTENSION_CLS
    # a user value replaces it (None: no extension, the updater then uses plain reload_weights)
    argv = commands.engine_command(
        model_path="/m",
        host="127.0.0.1",
        port=8000,
        vllm_args={"worker_extension_cls": None},
        tp=1,
        dp=1,
        served_model_name="m",
        kv_role=None,
        kv_connector=None,
        kv_extra=None,
        defaults=commands.ENGINE_DEFAULTS,
    )
    assert "--worker-extension-cls" not in argv


def test_login_node_import_pulls_neither_torch_nor_vllm():
    code = (
        "import sys, toolkit.inference.worker_ext, toolkit.inference.weights; "
        "print(sorted(m for m in ('torch', 'vllm') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_weight_files_natural_order_and_missing(tmp_path):
    for name in ("model-00010-of-00010.safetensors", "model-00002-of-00010.safetensors", "config.json"):
        (tmp_path / name).write_bytes(b"x")
    assert [f.name for f in weight_files(tmp_path)] == [
        "model-00002-of-00010.safetensors",
        "model-00010-of-00010.safetensors",
    ]
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
        weight_files(tmp_path / "nothing")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc mallopt")
def test_keep_freed_memory_in_a_child_process():
    # a child: mallopt changes the whole process's allocator for good
    code = (
        "from toolkit.inference.worker_ext import keep_freed_memory as k; a = k(); b = k(); "
        "print(a, b); bytearray(64 << 20)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "True"]


def test_reload_of_a_directory_without_weights_is_answered_not_raised(tmp_path):
    class Worker(SrlWorkerExtension):  # never reached: the check comes first
        def reload_weights(self, **kw):
            raise AssertionError("reload_weights must not run")

    answer = Worker().srl_reload_weights(str(tmp_path))
    assert answer[RESULT_MARKER] >= 1 and "no *.safetensors" in answer["error"]
    json.dumps(answer)  # travels back through /collective_rpc as JSON
    # Not a path at all (what a hand-made /collective_rpc body can carry): answered too, never raised, since an
    # exception in a collective_rpc method kills a vLLM engine.
    for bad in (7, None, ["a", "b"], {"p": 1}):
        answer = Worker().srl_reload_weights(bad)
        assert "TypeError" in answer["error"], bad


def test_in_flight_lists_each_held_request_by_tokens_sampled():
    class State:
        def __init__(self, n):
            self.output_token_ids = list(range(n))

    class Runner:
        def __init__(self):
            self.requests = {"b": State(40), "a": State(3), "c": State(0)}

    class Worker(SrlWorkerExtension):
        model_runner = Runner()

    answer = Worker().srl_in_flight()
    assert answer == {RESULT_MARKER: 1, "output_tokens": [0, 3, 40]}
    json.dumps(answer)

    class Bare(SrlWorkerExtension):  # another runner: answered with an error, never raised
        model_runner = object()

    assert "no request table" in Bare().srl_in_flight()["error"]


def test_has_extension_reads_server_info_config():
    assert _has_extension({"parallel_config": {"worker_extension_cls": EXTENSION_CLS}})
    assert not _has_extension({"parallel_config": {"worker_extension_cls": ""}})
    assert not _has_extension({"parallel_config": {"worker_extension_cls": "other.Ext"}})
    assert not _has_extension({}) and not _has_extension("not a dict") and not _has_extension(None)


def _resp(body) -> httpx.Response:
    return httpx.Response(200, json=body)


def test_extension_answer_needs_the_marker_from_every_worker():
    ok = {RESULT_MARKER: 1, "seconds": 0.5}
    assert _extension_answer("u", _resp({"results": [ok, ok]})) == ok
    for bad in ({"results": []}, {"results": [None]}, {"results": [ok, None]}, {"results": ["x"]}, [1], {}):
        with pytest.raises(WeightUpdateError, match=RELOAD_METHOD):
            _extension_answer("u", _resp(bad))
    with pytest.raises(WeightUpdateError, match="FileNotFoundError: gone"):
        _extension_answer("u", _resp({"results": [{RESULT_MARKER: 1, "error": "FileNotFoundError: gone"}]}))
    with pytest.raises(WeightUpdateError):
        _extension_answer("u", httpx.Response(200, content=b"not json"))


def _pinned_read_ahead(files, cpu):
    """A _ReadAhead started from a thread pinned to ``cpu`` (as vLLM pins its CPU worker), joined."""
    box = {}

    def start():
        os.sched_setaffinity(0, {cpu})
        box["ahead"] = _ReadAhead(files)
        box["ahead"].join()

    import threading

    t = threading.Thread(target=start)
    t.start()
    t.join()
    return box["ahead"]


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or (os.cpu_count() or 1) < 2, reason="needs 2 cores")
def test_read_ahead_reads_every_byte_on_the_cores_the_worker_does_not_use(tmp_path):
    files = []
    for i, size in enumerate((3 << 20, 17 << 20, 0)):  # a chunk boundary inside the second file, an empty one
        f = tmp_path / f"model-{i}.safetensors"
        f.write_bytes(os.urandom(size))
        files.append(f)
    ahead = _pinned_read_ahead(files, cpu=0)
    assert ahead.cpus == set(range(os.cpu_count())) - {0}
    assert ahead.bytes_read == sum(f.stat().st_size for f in files)


def test_read_ahead_of_a_vanished_file_ends_quietly(tmp_path):
    (tmp_path / "a.safetensors").write_bytes(b"x" * 100)
    ahead = _ReadAhead([tmp_path / "a.safetensors", tmp_path / "gone.safetensors", tmp_path / "a.safetensors"])
    ahead.join()
    assert ahead.bytes_read == 100  # stopped at the missing file, raised nothing
