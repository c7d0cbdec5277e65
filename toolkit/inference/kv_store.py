"""The file store of vLLM's ExampleConnector (CPU prefill/decode): finding it and retiring it on a weight reload.

Why: vLLM 0.32's ExampleConnector writes each prompt's KV to ``<shared_storage_path>/<hash of prompt tokens>/
<layer>.safetensors``. The key holds the prompt tokens only, never the weights that computed the KV. The producer
(prefill engine) skips storing when the prompt's folder exists, and the consumer (decode engine) loads whatever it
finds there; the connector implements no ``reset_cache``, so vLLM's ``/reset_prefix_cache?reset_external=true``
leaves the files alone. After a weight reload, a repeated prompt (GRPO sends each one ``group_size`` times, eval
repeats prompts) would then be decoded from KV of the old policy. The weight updater therefore retires the store
while every engine is paused, so no engine serves the new policy version with KV it cannot have computed.

Retiring moves every entry of the store into a hidden folder inside it (one rename per prompt folder: a prompt's
KV becomes unreachable all at once, never half of its layers) and the folder is deleted later, off the pause
window. The connector only looks up hex-named folders, so the hidden one is never hit. All engines of a
deployment share one store (one path on a shared filesystem), so one retire serves every prefill and decode
replica, and a restarted engine, whose store path comes from the same command, keeps using it.

Login-node safe: no torch or vllm imports.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# vLLM registry names of connectors whose KV lives as files under kv_connector_extra_config.shared_storage_path
# ("SharedStorageConnector" is the pre-0.30 name of ExampleConnector).
FILE_STORE_CONNECTORS = frozenset({"ExampleConnector", "SharedStorageConnector"})
RETIRED_PREFIX = ".srl-retired-"


def kv_store_from_config(vllm_config: Mapping[str, Any]) -> Path | None:
    """The KV file store of an engine, from its ``vllm_config`` as JSON (``GET /server_info?config_format=json``),
    or None when the engine has no file-store connector. vLLM's own default path (``/tmp``) applies when the
    connector config names none; srl always names one (``commands.kv_transfer_config``)."""
    kv = vllm_config.get("kv_transfer_config") or {}
    if not isinstance(kv, Mapping) or kv.get("kv_connector") not in FILE_STORE_CONNECTORS:
        return None
    extra = kv.get("kv_connector_extra_config") or {}
    return Path(str(extra.get("shared_storage_path", "/tmp")))


def retire_kv_store(store: Path) -> tuple[int, Path | None]:
    """Make every KV entry of ``store`` unreachable to the connector; returns ``(entries moved, retired folder)``.

    Each entry is renamed into ``store/.srl-retired-<uuid>`` (renames within one directory: atomic, O(1) per
    prompt, no data copied). A missing store gives ``(0, None)``: nothing was stored yet. Only call it while no
    engine writes to the store (every engine paused), otherwise a folder being written could survive half-written.
    Raises OSError when an entry cannot be moved (the caller must not resume serving stale KV).
    """
    try:
        entries = [e for e in os.scandir(store) if not e.name.startswith(RETIRED_PREFIX)]
    except FileNotFoundError:
        return 0, None
    if not entries:
        return 0, None
    retired = Path(store) / f"{RETIRED_PREFIX}{uuid.uuid4().hex}"
    retired.mkdir()
    for e in entries:
        os.rename(e.path, retired / e.name)
    return len(entries), retired


def purge_retired(store: Path) -> int:
    """Delete every retired folder inside ``store`` (also ones left by an earlier, interrupted update); returns how
    many were removed. Best effort: files the OS refuses to delete stay, and are retried at the next purge."""
    try:
        entries = [e for e in os.scandir(store) if e.name.startswith(RETIRED_PREFIX)]
    except FileNotFoundError:
        return 0
    for e in entries:
        shutil.rmtree(e.path, ignore_errors=True)
    return len(entries)
