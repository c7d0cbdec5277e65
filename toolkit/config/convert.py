"""Map the other config shapes researchers bring onto the canonical (native v1) shape.

Shapes handled (each mapping leaves a notice that the CLI prints and the resolved config keeps):

* the hosted flat shape of verifiers' training.md: top-level ``model = "..."``, ``batch_size``,
  ``rollouts_per_example``, ``[sampling] max_tokens``, ``[[env]] id/args``, ``[wandb]``;
* the older names of the second seed: ``rollouts_per_example``, ``oversampling_factor``, ``easy_threshold``,
  ``hard_threshold``, ``online_difficulty_filtering`` next to (not inside) ``[orchestrator.buffer]``,
  ``sampling.max_tokens``;
* the legacy v0 env bridge ``[[orchestrator.train.env]] id = "...", args = {...}``: kept, labelled ``legacy``, and
  given a ``taskset`` (id + args as typed taskset fields). Native v1 fields inside ``args`` are an error.

All functions work on plain dicts (before pydantic validation) and never mutate their input.
"""

from __future__ import annotations

import copy
from typing import Any

from .compose import subtable
from .errors import ConfigError, ConfigIssue

NATIVE_V1_FIELDS = {"taskset", "harness", "runtime", "timeout", "pool", "max_turns", "max_total_tokens", "retries"}
_BUFFER_KEYS = ("online_difficulty_filtering", "oversampling_factor", "easy_threshold", "hard_threshold")


def to_canonical(raw: dict[str, Any], *, source: str | None = None) -> tuple[dict[str, Any], list[str]]:
    """Return ``(canonical_dict, notices)``. Raises ConfigError for shapes that cannot be mapped safely."""
    data = copy.deepcopy(raw)
    notices: list[str] = []
    where = f" ({source})" if source else ""
    _hosted_flat(data, notices, where)
    _older_names(data, notices, where)
    _legacy_envs(data, notices, where, source)
    return data, notices


def _hosted_flat(data: dict[str, Any], notices: list[str], where: str) -> None:
    if isinstance(data.get("model"), str):
        data["model"] = {"name": data["model"]}
        notices.append(f'hosted shape{where}: model = "..." -> [model] name')
    moves = {
        "batch_size": ("orchestrator", "batch_size"),
        "rollouts_per_example": ("orchestrator", "group_size"),
        "max_async_level": ("orchestrator", "max_async_level"),
        "max_concurrent": ("orchestrator", "max_concurrent"),
        "learning_rate": ("trainer", "optim", "lr"),
        "lr": ("trainer", "optim", "lr"),
    }
    for key, dest in moves.items():
        if key in data:
            subtable(data, *dest[:-1])[dest[-1]] = data.pop(key)
            notices.append(f"hosted shape{where}: {key} -> {'.'.join(dest)}")
    if isinstance(data.get("sampling"), dict):
        sampling = data.pop("sampling")
        if "max_tokens" in sampling:
            sampling["max_completion_tokens"] = sampling.pop("max_tokens")
        subtable(data, "orchestrator", "train", "sampling").update(sampling)
        notices.append(
            f"hosted shape{where}: [sampling] -> [orchestrator.train.sampling] (max_tokens -> max_completion_tokens)"
        )
    if isinstance(data.get("env"), list):
        envs = data.pop("env")
        subtable(data, "orchestrator", "train").setdefault("env", []).extend(envs)
        notices.append(f"hosted shape{where}: [[env]] -> [[orchestrator.train.env]]")
    if isinstance(data.get("wandb"), dict):
        subtable(data, "monitors")["wandb"] = data.pop("wandb")
        notices.append(f"hosted shape{where}: [wandb] -> [monitors.wandb]")
    if isinstance(data.get("buffer"), dict):
        subtable(data, "orchestrator", "buffer").update(data.pop("buffer"))
        notices.append(f"older name{where}: [buffer] -> [orchestrator.buffer]")


def _older_names(data: dict[str, Any], notices: list[str], where: str) -> None:
    orch = data.get("orchestrator")
    if not isinstance(orch, dict):
        return
    if "rollouts_per_example" in orch:
        orch["group_size"] = orch.pop("rollouts_per_example")
        notices.append(f"older name{where}: orchestrator.rollouts_per_example -> orchestrator.group_size")
    for key in _BUFFER_KEYS:
        if key in orch:
            subtable(orch, "buffer")[key] = orch.pop(key)
            notices.append(f"older name{where}: orchestrator.{key} -> orchestrator.buffer.{key}")
    if isinstance(orch.get("sampling"), dict):
        subtable(orch, "train", "sampling").update(orch.pop("sampling"))
        notices.append(f"older name{where}: [orchestrator.sampling] -> [orchestrator.train.sampling]")
    sampling = orch.get("train", {}).get("sampling") if isinstance(orch.get("train"), dict) else None
    if isinstance(sampling, dict) and "max_tokens" in sampling:
        sampling["max_completion_tokens"] = sampling.pop("max_tokens")
        notices.append(f"older name{where}: sampling.max_tokens -> sampling.max_completion_tokens")
    for _, env in _env_dicts(orch):
        if "rollouts_per_example" in env:
            env["group_size"] = env.pop("rollouts_per_example")
            notices.append(f"older name{where}: env rollouts_per_example -> group_size")


def _env_dicts(orch: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Every train and eval env table of a raw ``orchestrator`` table, with its field path."""
    out = []
    for section in ("train", "eval"):
        sec = orch.get(section)
        if isinstance(sec, dict) and isinstance(sec.get("env"), list):
            out += [(f"orchestrator.{section}.env[{i}]", e) for i, e in enumerate(sec["env"]) if isinstance(e, dict)]
    return out


def _legacy_envs(data: dict[str, Any], notices: list[str], where: str, source: str | None) -> None:
    orch = data.get("orchestrator")
    if not isinstance(orch, dict):
        return
    issues = []
    for path, env in _env_dicts(orch):
        args = env.get("args") or {}
        if "id" not in env or "taskset" in env or not isinstance(args, dict):
            continue  # a wrong type of args: pydantic reports it with its path
        misplaced = sorted(NATIVE_V1_FIELDS & set(args))
        if misplaced:
            issues.append(
                ConfigIssue(
                    f"{path}.args",
                    f"native v1 fields {misplaced} found under args (the legacy v0 bridge); move them to the env "
                    "entry's top level",
                    source,
                )
            )
            continue
        env["taskset"] = {"id": env["id"], **args}
        env["legacy"] = True
        notices.append(
            f"legacy v0 bridge{where}: {path} id = '{env['id']}' is labelled legacy; new work should use "
            "taskset/harness"
        )
    if issues:
        raise ConfigError(issues)
