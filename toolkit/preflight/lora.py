"""Rules of a LoRA run: the engines must serve an adapter of the trainer's rank, and the adapter must target layers
the model has (peft would fail at trainer start, vLLM at the first policy update, both inside the job).

Sources: vLLM 0.32's LoRA arguments (``--enable-lora``, ``--max-lora-rank`` from a fixed set, ``--max-loras``),
peft's ``target_modules`` suffix matching, and the HF decoder layers of the supported model families.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..config.errors import Findings
from ..config.model import RLConfig
from ..config.passthrough import option_key
from ..engines.commands import VLLM_LORA_RANKS, lora_engine_args
from ..run.layout import RunDir

# LoRA target modules srl can train and vLLM can serve, per HF ``model_type``: the attention and MLP projections of
# each decoder layer (vLLM serves them through its packed qkv_proj / gate_up_proj LoRA layers, and a packed layer
# with only some of its parts targeted; embeddings and lm_head are not adapted by srl).
_DECODER_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LORA_TARGETS: dict[str, tuple[str, ...]] = {
    t: _DECODER_PROJECTIONS
    for t in ("llama", "mistral", "qwen2", "qwen3")  # dense families only
}
# model_type of each built-in alias (toolkit.models.resolve.MODEL_ALIASES), known before the alias is built.
ALIAS_MODEL_TYPES = {"tiny-qwen3": "qwen3", "smollm2-135m": "llama"}


def _model_type(name: str) -> str | None:
    """HF ``model_type`` of an alias or a model directory's config.json; None when it cannot be read."""
    if name in ALIAS_MODEL_TYPES:
        return ALIAS_MODEL_TYPES[name]
    try:
        data = json.loads((Path(name).expanduser() / "config.json").read_text())
    except (OSError, ValueError):
        return None
    kind = data.get("model_type") if isinstance(data, dict) else None
    return kind if isinstance(kind, str) else None


def _engine_flag(argv: list[str], flag: str) -> str | None:
    """Value after ``flag`` in an engine argv ("" for a bare flag, None when absent)."""
    if flag not in argv:
        return None
    i = argv.index(flag) + 1
    return argv[i] if i < len(argv) and not argv[i].startswith("--") else ""


def check_lora(cfg: RLConfig, f: Findings) -> None:
    """A LoRA run needs engines that serve a LoRA of the trainer's rank, and targets the model has.

    Refused: ``[inference.vllm]`` values that switch LoRA off or cap the rank below the trainer's (the first policy
    update would fail inside the job), target modules outside the model family's projections (peft fails at trainer
    start), and an external inference deployment whose engines were started without such LoRA support.
    """
    lora = cfg.trainer.model.lora
    if lora is None:
        return
    need = lora_engine_args(lora.rank)["max_lora_rank"]  # rank <= 512 is a field bound
    for key, value in cfg.inference.vllm.items():
        norm = option_key(key)
        where = f"inference.vllm.{key}"
        if norm == "enable_lora" and value is not True:
            f.error(
                where,
                f"is {value!r} but trainer.model.lora is set: the engines must serve the adapter; "
                "remove the key (srl adds --enable-lora)",
            )
        elif norm == "max_lora_rank" and (isinstance(value, bool) or value not in VLLM_LORA_RANKS or value < lora.rank):
            allowed = [r for r in VLLM_LORA_RANKS if r >= lora.rank]
            f.error(
                where,
                f"{value!r} cannot serve trainer.model.lora.rank = {lora.rank}; allowed: {allowed} "
                f"(or remove the key: srl sets {need})",
            )
        elif norm == "max_loras" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            f.error(
                where,
                f"{value!r}: the engines hold the policy adapter, so max_loras must be an integer >= 1 "
                "(or remove the key: srl sets 1)",
            )

    if lora.dropout > 0:
        # The trainer computes logprobs in train mode (dropout active) while the engines sample without dropout:
        # the importance ratio and the IPO mask would compare two different policies.
        f.error(
            "trainer.model.lora.dropout",
            f"{lora.dropout}: the engines sample without dropout, so the trainer's "
            "logprobs would not be those of the sampling policy; allowed: 0.0",
        )
    kind = _model_type(cfg.model.name)
    allowed_mods = LORA_TARGETS.get(kind or "")
    if not lora.target_modules:
        f.error(
            "trainer.model.lora.target_modules",
            f"is empty: name the layers to adapt, from {list(allowed_mods or _DECODER_PROJECTIONS)}",
        )
    elif allowed_mods is None:
        f.warn(
            "trainer.model.lora.target_modules",
            f"model_type {kind!r} of model.name is not one srl knows "
            f"({sorted(LORA_TARGETS)}); the target modules are checked only when the trainer starts",
        )
    else:
        bad = [m for m in lora.target_modules if m.rsplit(".", 1)[-1] not in allowed_mods]
        if bad:
            f.error(
                "trainer.model.lora.target_modules",
                f"{bad} are not layers of a {kind} model that srl can "
                f"adapt; allowed: {list(allowed_mods)} (or a dotted suffix ending in one)",
            )

    if cfg.inference.external:
        _lora_external(cfg, f, need)


def _lora_external(cfg: RLConfig, f: Findings, need: int) -> None:
    """The engines of ``inference.external`` (from its launcher/placement.json, when written) must serve LoRA."""
    path = RunDir(Path(cfg.inference.external).expanduser()).placement_file
    try:
        processes = json.loads(path.read_text())["processes"]
    except (OSError, ValueError, KeyError, TypeError):
        return  # not placed yet (or not an srl run dir): the orchestrator reports it when it connects
    for p in processes:
        if not isinstance(p, dict) or p.get("role") != "inference":
            continue
        argv = [str(a) for a in p.get("command", [])]
        rank = _engine_flag(argv, "--max-lora-rank")
        if _engine_flag(argv, "--enable-lora") is None:
            f.error(
                "inference.external",
                f"engine {p.get('name')!r} of {cfg.inference.external} runs without "
                "--enable-lora, so it cannot serve trainer.model.lora; start that deployment with the same "
                "[trainer.model.lora] table",
            )
            return
        if rank is None or not rank.isdigit() or int(rank) < need:
            f.error(
                "inference.external",
                f"engine {p.get('name')!r} of {cfg.inference.external} has "
                f"--max-lora-rank {rank}, below the {need} that trainer.model.lora.rank = "
                f"{cfg.trainer.model.lora.rank} needs",
            )
            return
