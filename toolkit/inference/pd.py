"""Prefill/decode (P/D) disaggregated layouts: which engine runs where, with which ports, KV role and env.

Pure (login-node safe). A layout is a list of islands; an island is a set of nodes whose prefill and decode engines
exchange KV among themselves (one NVLink/InfiniBand domain) behind their own vllm-router. Engines are packed onto
an island's nodes in order, prefill first, ``tp * dp`` GPUs each.

Ports: every engine on a host gets its own HTTP port and its own NIXL side-channel port range. vLLM's
NixlConnector listens on ``VLLM_NIXL_SIDE_CHANNEL_PORT + data_parallel_index``, so ranges are ``dp`` wide and must
not overlap between co-located engines (vLLM: co-located P and D must differ in every
port; the side-channel host must be the node's own routable address, never localhost).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolkit.inference.commands import CommandError, engine_command, engine_env, router_command

# P:D presets (prefill replicas : decode replicas). Agentic workloads re-send long, growing contexts every turn, so
# prefill dominates; math/chat emit long completions from short prompts, so decode dominates.
PD_PRESETS: dict[str, tuple[int, int]] = {
    "agentic": (3, 1),
    "decode_heavy": (1, 2),
}

KV_ROLE_OF = {"prefill": "kv_producer", "decode": "kv_consumer"}


@dataclass(frozen=True)
class Island:
    """Nodes (routable addresses) of one P/D island and how many prefill/decode replicas it runs."""

    hosts: tuple[str, ...]
    prefill_replicas: int
    decode_replicas: int
    gpus_per_node: int = 8


@dataclass(frozen=True)
class EngineSlot:
    """One engine of a P/D layout. ``gpus`` are local device indices on ``host``; ports are TCP ports."""

    island: int
    role: str  # "prefill" | "decode"
    index: int  # replica index within the role and island
    host: str
    port: int
    side_channel_port: int
    gpus: tuple[int, ...]

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


@dataclass
class EngineSpec:
    """What to run for one engine: argv and the env vars to add over the inherited environment."""

    slot: EngineSlot
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)


def pd_slots(
    islands: Sequence[Island],
    *,
    tp: int,
    dp: int = 1,
    base_port: int = 8000,
    side_channel_base: int = 5600,
) -> list[EngineSlot]:
    """Place every island's prefill then decode engines onto its hosts, ``tp * dp`` GPUs each.

    Raises CommandError when an island's engines do not fit its GPUs or an engine would span nodes (multi-node
    engines are not placed here).
    """
    width = tp * dp
    slots: list[EngineSlot] = []
    for i, isl in enumerate(islands):
        if width > isl.gpus_per_node:
            raise CommandError(f"island {i}: an engine needs {width} GPUs but a node has {isl.gpus_per_node}")
        per_node = isl.gpus_per_node // width
        roles = ["prefill"] * isl.prefill_replicas + ["decode"] * isl.decode_replicas
        if len(roles) > per_node * len(isl.hosts):
            raise CommandError(
                f"island {i}: {len(roles)} engines of {width} GPUs do not fit {len(isl.hosts)} node(s) x "
                f"{isl.gpus_per_node} GPUs"
            )
        counters = {"prefill": 0, "decode": 0}
        for k, role in enumerate(roles):
            node, local = divmod(k, per_node)
            slots.append(
                EngineSlot(
                    island=i,
                    role=role,
                    index=counters[role],
                    host=isl.hosts[node],
                    port=base_port + local,
                    side_channel_port=side_channel_base + local * dp,
                    gpus=tuple(range(local * width, (local + 1) * width)),
                )
            )
            counters[role] += 1
    return slots


def pd_engine_specs(
    slots: Sequence[EngineSlot],
    *,
    model_path: str | Path,
    served_model_name: str,
    vllm_args: Mapping[str, Any],
    tp: int,
    dp: int = 1,
    kv_connector: str = "nixl",
    kv_extra: Mapping[str, Any] | None = None,
    prefill_env: Mapping[str, str] | None = None,
    decode_env: Mapping[str, str] | None = None,
    cpu: bool = False,
    python: str = sys.executable,
    defaults: Mapping[str, Any] | None = None,
    allow_loopback: bool = False,
) -> list[EngineSpec]:
    """argv and env of every engine in ``slots``: KV role from the slot's role, NIXL side channel on the slot's own
    host and port (only for NixlConnector), ``CUDA_VISIBLE_DEVICES`` from the slot's GPUs (GPU layouts), and the
    per-role user env (``[inference.deployment.prefill_env_vars/decode_env_vars]``)."""
    nixl = kv_connector.lower() in ("nixl", "nixlconnector")
    specs = []
    for s in slots:
        argv = engine_command(
            model_path=model_path,
            host=s.host,
            port=s.port,
            vllm_args=vllm_args,
            tp=tp,
            dp=dp,
            served_model_name=served_model_name,
            kv_role=KV_ROLE_OF[s.role],
            kv_connector=kv_connector,
            kv_extra=kv_extra,
            python=python,
            defaults=defaults,
        )
        env = engine_env(
            role=s.role,
            omp_bind=None,
            side_channel_host=s.host if nixl else None,
            side_channel_port=s.side_channel_port if nixl else None,
            cpu=cpu,
            user_env=(prefill_env if s.role == "prefill" else decode_env) or {},
            allow_loopback=allow_loopback,
        )
        if not cpu:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, s.gpus))
        specs.append(EngineSpec(slot=s, argv=argv, env=env))
    return specs


def pd_router_commands(
    slots: Sequence[EngineSlot],
    *,
    router_port: int,
    policy: str = "sticky_least_loaded",
    request_timeout_s: float = 600,
    kv_connector: str = "nixl",
    router_host: str = "0.0.0.0",
    **router_kw: Any,
) -> dict[int, list[str]]:
    """One vllm-router argv per island (island index -> argv), in P/D mode over that island's engines only, so KV
    never crosses islands. Each router runs on its island's first host at ``router_port``."""
    out: dict[int, list[str]] = {}
    for island in sorted({s.island for s in slots}):
        mine = [s for s in slots if s.island == island]
        out[island] = router_command(
            host=router_host,
            port=router_port,
            engine_urls=[],
            policy=policy,
            request_timeout_s=request_timeout_s,
            prefill_urls=[s.url for s in mine if s.role == "prefill"],
            decode_urls=[s.url for s in mine if s.role == "decode"],
            kv_connector=kv_connector,
            **router_kw,
        )
    return out
