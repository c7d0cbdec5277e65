"""Rules for values that become program arguments or point at things: the ``[inference.vllm]`` pass-through table,
addresses and import paths that must have a shape, and the trainer's row length against the longest rollout.
Whether the things pointed at exist is checked by :mod:`toolkit.preflight.checks`.
"""

from __future__ import annotations

import re

from .errors import Findings
from .model import RLConfig
from .passthrough import option_key, vllm_max_model_len, whole_number

# vLLM options whose values the plan sets for multi-node (data-parallel) engines, beyond commands.PLAN_OWNED_ARGS:
# a user value would replace the plan's (they are merged as engine defaults) and break the engines' rendezvous.
_PLAN_DP_ARGS = (
    "data_parallel_size_local",
    "data_parallel_address",
    "data_parallel_rpc_port",
    "data_parallel_start_rank",
    "data_parallel_rank",
    "headless",
)
# The only logprobs mode whose values are those of the distribution tokens were sampled from (after temperature
# and truncation), which the importance ratio and the IPO mask need (commands.ENGINE_DEFAULTS).
_LOGPROBS_MODE = "processed_logprobs"
_OPTION_NAME = re.compile(r"-{0,2}[A-Za-z][A-Za-z0-9_-]*")
# Common vLLM options that take a whole number (>= 1, seed >= 0): a value of another kind makes the engine exit at
# start-up with an argparse error, inside the job, after the queue wait. max_model_len is not here: it also takes
# words ("auto") and suffixes ("32k"), checked on its own below.
_WHOLE_NUMBER_OPTIONS = (
    "max_loras",
    "max_lora_rank",
    "max_cpu_loras",
    "max_num_seqs",
    "max_num_batched_tokens",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "data_parallel_size",
    "block_size",
    "max_logprobs",
    "seed",
)


def check_vllm_table(cfg: RLConfig, f: Findings) -> None:
    """``[inference.vllm]`` keys become ``--options`` and values their arguments (one argv token each, no shell):
    a key that is not an option name, a text value holding a newline, a data-parallel value the plan sets, or a
    logprobs mode other than the sampling distribution's would make the engine fail at start or sample wrong
    logprobs, inside the job. Refused here, naming the key."""
    for key, value in cfg.inference.vllm.items():
        where = f"inference.vllm.{key}"
        norm = option_key(key)
        if not _OPTION_NAME.fullmatch(str(key)):
            f.error(
                "inference.vllm",
                f"{key!r} is not a vLLM option name (letters, digits, '_' or '-', like max_model_len or max-model-len)",
            )
            continue
        texts = (
            [value]
            if isinstance(value, str)
            else [v for v in value if isinstance(v, str)]
            if isinstance(value, list)
            else []
        )
        if any(("\n" in t or "\r" in t) for t in texts):
            f.error(where, "a value holding a newline is never a valid vLLM argument; give one line")
        if norm in _PLAN_DP_ARGS:
            f.error(
                where,
                "is set by the placement plan for data-parallel (multi-node) engines; remove it and "
                "size engines with [inference.deployment] and deployment.gpus_per_node",
            )
        low, n = (0 if norm == "seed" else 1), whole_number(value)
        if norm in _WHOLE_NUMBER_OPTIONS and (n is None or n < low):
            f.error(where, f"{value!r} is not a whole number >= {low}")
        if norm == "max_model_len" and not _is_model_len(value):
            f.error(
                where,
                f"{value!r} is not a context length vLLM reads: a whole number >= 1 (or with a suffix, "
                "like 32k or 32K), -1 or 'auto' (fit the GPU's memory)",
            )
        if norm == "gpu_memory_utilization" and not (_is_number(value) and 0 < float(value) <= 1):
            f.error(where, f"{value!r} is not a fraction of the GPU's memory in (0, 1]")
        if norm == "logprobs_mode" and value != _LOGPROBS_MODE:
            f.error(
                where,
                f"{value!r}: srl's importance ratios need the logprobs of the distribution tokens were "
                f"sampled from; allowed: ['{_LOGPROBS_MODE}'] (or remove the key)",
            )


# vLLM's own reading of --max-model-len: digits, a k/m/g/t (decimal, may have a fraction) or K/M/G/T (binary,
# whole) suffix, -1 or "auto".
_MODEL_LEN = re.compile(r"\d+|\d+(\.\d+)?[kmgt]|\d+[KMGT]|-1|auto")


def _is_model_len(value: object) -> bool:
    if isinstance(value, int) and not isinstance(value, bool):
        return value >= 1 or value == -1
    return isinstance(value, str) and bool(_MODEL_LEN.fullmatch(value.strip())) and value.strip() not in ("0",)


def _is_number(value: object) -> bool:
    try:
        return not isinstance(value, bool) and float(value) == float(value)  # type: ignore[arg-type]  # NaN: False
    except (TypeError, ValueError):
        return False


_ADDRESS = re.compile(r"[A-Za-z0-9_.-]+:(\d{1,5})|\[[0-9A-Fa-f:.]+\]:(\d{1,5})")
_IMPORT_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*")


def check_references(cfg: RLConfig, f: Findings) -> None:
    """Values that point at something must have its shape: ``package.module:Class``, ``host:port``."""
    ip = cfg.orchestrator.renderer.import_path
    if ip is not None and not _IMPORT_PATH.fullmatch(ip):
        f.error("orchestrator.renderer.import_path", f"{ip!r} is not 'package.module:Class'")
    for path, e in cfg.orchestrator.env_entries():
        if e.address is None:
            continue
        m = _ADDRESS.fullmatch(e.address)
        port = int(next(g for g in m.groups() if g is not None)) if m else 0
        if not 0 < port < 65536:
            f.error(f"{path}.address", f"{e.address!r} is not host:port (a host name or address, then a port 1-65535)")


def check_row_fits_rollout(cfg: RLConfig, f: Findings) -> None:
    """A train rollout may reach min(max_total_tokens, the engines' max_model_len) tokens; the trainer packs each
    into one row of trainer.seq_len tokens and stops on the first that does not fit (toolkit.trainer.packing)."""
    mml = vllm_max_model_len(cfg.inference.vllm)
    for i, e in enumerate(cfg.orchestrator.train.env):
        longest = min(e.max_total_tokens, mml) if mml else e.max_total_tokens
        if longest > cfg.trainer.seq_len:
            f.warn(
                "trainer.seq_len",
                f"{cfg.trainer.seq_len} tokens < {longest}, the longest rollout env "
                f"'{e.env_name}' may produce (orchestrator.train.env[{i}].max_total_tokens"
                f"{', inference.vllm.max_model_len' if mml else ''}): the trainer stops at the first such "
                "rollout; raise trainer.seq_len or lower the limit",
            )
