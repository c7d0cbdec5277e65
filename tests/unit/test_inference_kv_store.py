"""KV file store retirement on weight reload (toolkit.inference.kv_store) and the WeightUpdater steps around it,
against an HTTP stand-in engine that answers like vLLM 0.32 in dev mode (/server_info with an ExampleConnector
config, /reset_prefix_cache refusing with ``{"success": false}`` while requests run). The real-engine check is
tests/integration/test_inference_pd_reload.py."""

from __future__ import annotations

import asyncio
import http.server
import json
import threading
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from toolkit.inference.kv_store import (
    RETIRED_PREFIX,
    kv_store_from_config,
    purge_retired,
    retire_kv_store,
)
from toolkit.inference.weights import WeightUpdateError, WeightUpdater


def fill_store(store: Path, prompts: int) -> list[str]:
    """Lay out KV files the way the ExampleConnector does: ``<store>/<hex hash>/<layer>.safetensors``."""
    names = []
    for i in range(prompts):
        d = store / f"{i:040x}"
        d.mkdir(parents=True)
        for layer in ("model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"):
            (d / f"{layer}.safetensors").write_bytes(b"kv" * 100)
        names.append(d.name)
    return names


def test_kv_store_from_config_only_for_file_store_connectors(tmp_path):
    cfg = {
        "kv_transfer_config": {
            "kv_connector": "ExampleConnector",
            "kv_role": "kv_consumer",
            "kv_connector_extra_config": {"shared_storage_path": str(tmp_path)},
        }
    }
    assert kv_store_from_config(cfg) == tmp_path
    assert kv_store_from_config({"kv_transfer_config": {"kv_connector": "SharedStorageConnector"}}) == Path("/tmp")
    assert kv_store_from_config({"kv_transfer_config": {"kv_connector": "NixlConnector"}}) is None
    assert kv_store_from_config({"kv_transfer_config": None}) is None
    assert kv_store_from_config({}) is None


def test_retire_makes_every_prompt_unreachable_and_purge_deletes_it(tmp_path):
    store = tmp_path / "kv_store"
    assert retire_kv_store(store) == (0, None)  # nothing stored yet
    names = fill_store(store, 5)
    n, retired = retire_kv_store(store)
    assert n == 5 and retired is not None and retired.parent == store
    assert [p.name for p in store.iterdir()] == [retired.name]  # no prompt folder left where the connector looks
    assert sorted(p.name for p in retired.iterdir()) == names  # moved, not copied
    assert retire_kv_store(store) == (0, None)  # retired folders are not retired again
    (store / f"{RETIRED_PREFIX}left-by-a-crash").mkdir()
    assert purge_retired(store) == 2
    assert list(store.iterdir()) == []
    assert purge_retired(tmp_path / "missing") == 0


class _Engine(http.server.BaseHTTPRequestHandler):
    """vLLM-like answers; records (path, query, prompt folders in the store) per call."""

    def _reply(self, body: dict, code: int = 200) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _record(self) -> tuple[str, dict]:
        url = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        store: Path = self.server.store
        live = sorted(p.name for p in store.iterdir() if not p.name.startswith(".")) if store.exists() else []
        self.server.calls.append((url.path, query, live))
        return url.path, query

    def do_GET(self):
        path, _ = self._record()
        if path == "/server_info":
            extra = {"shared_storage_path": str(self.server.store)}
            self._reply(
                {
                    "vllm_config": {
                        "kv_transfer_config": {
                            "kv_connector": "ExampleConnector",
                            "kv_role": "kv_producer",
                            "kv_connector_extra_config": extra,
                        }
                    }
                }
            )
        else:
            self._reply({"weight_version": "default"})

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)) or 0)
        path, query = self._record()
        if path == "/reset_prefix_cache":
            # running requests hold blocks: only preempting them lets the reset through (unless it never does)
            ok = query.get("reset_running_requests") == "true" and not self.server.refuse_reset
            self._reply({"success": ok})
        else:
            self._reply({})

    def log_message(self, *args):
        pass


@pytest.fixture
def engine(tmp_path):
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Engine)
    srv.store, srv.calls, srv.refuse_reset = tmp_path / "kv_store", [], False
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv, f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_update_retires_the_store_while_paused_and_resets_with_preemption(engine, tmp_path):
    srv, url = engine
    fill_store(srv.store, 3)
    updater = WeightUpdater([url, url + "/"], timeout_s=5, admin_token="t")  # two engines sharing one store
    asyncio.run(updater.update(tmp_path, 1))
    paths = [c[0] for c in srv.calls]
    assert paths[:2] == ["/server_info"] * 2 and paths.count("/server_info") == 2  # once per engine, before
    pause = paths.index("/pause")
    resets = [c for c in srv.calls if c[0] == "/reset_prefix_cache"]
    assert srv.calls[pause][2] != []  # the old KV was still there when the engines paused
    assert all(c[2] != [] for c in srv.calls[pause : paths.index("/collective_rpc") + 2])  # pause, reload
    assert all(c[2] == [] for c in srv.calls[paths.index("/resume") :])  # gone before the engines resume
    # One reset per engine, preempting at once (a plain one is always refused while requests run).
    assert [c[1] for c in resets] == [{"reset_external": "true", "reset_running_requests": "true"}] * 2
    assert paths[-1] == "/resume" and updater.last_retired_kv_entries == 3
    assert list(srv.store.iterdir()) == []  # retired files deleted after resume
    srv.calls.clear()
    fill_store(srv.store, 1)
    asyncio.run(updater.update(tmp_path, 2))  # the store is looked up once per engine
    assert "/server_info" not in [c[0] for c in srv.calls] and updater.last_retired_kv_entries == 1


def test_a_reset_refused_even_with_preemption_fails_the_update_and_resumes(engine, tmp_path):
    srv, url = engine
    srv.refuse_reset = True
    with pytest.raises(WeightUpdateError, match="kept its prefix cache"):
        asyncio.run(WeightUpdater([url], timeout_s=5, admin_token="t").update(tmp_path, 1))
    assert srv.calls[-1][0] == "/resume"


def test_prepare_looks_the_stores_up_once(engine, tmp_path):
    srv, url = engine
    updater = WeightUpdater([url], timeout_s=5, admin_token="t")
    assert asyncio.run(updater.prepare()) == [srv.store]
    asyncio.run(updater.update(tmp_path, 1))
    assert [c[0] for c in srv.calls].count("/server_info") == 1
