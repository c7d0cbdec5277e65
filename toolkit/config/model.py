"""The run config: one typed tree for the whole RL run, in the native v1 shape of prime-rl's environment configs.

Shape: prime-rl's native environment config (``[orchestrator]``,
``[orchestrator.renderer]``, ``[orchestrator.train.sampling]``, ``[[orchestrator.train.env]]`` with ``taskset``,
``harness``, ``timeout``, ``pool``, ``ratio``, ``address``; ``[orchestrator.eval]`` and ``[[orchestrator.eval.env]]``).

Rules that relate several fields live in :mod:`toolkit.config.rules`; this module only declares fields, units and
bounds. Every model forbids unknown keys (a typo is an error, never silently ignored).
"""

from __future__ import annotations

import datetime
import os
import re
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

# Stage timeouts must be finite: an unbounded remote stage can hang a run forever. 7 days is the ceiling.
_MAX_TIMEOUT_S = 7 * 24 * 3600.0
# Seeds reach torch (``manual_seed``: at most 2**64 - 1), numpy generators (no negative seeds) and vLLM's int64
# request seed: the range all of them take.
_MAX_SEED = 2**63 - 1


def _number_as_text(v: Any) -> Any:
    """An environment variable's value is text: ``--env-vars.OMP_NUM_THREADS 4`` (or ``= 4`` in TOML) reads as
    the number 4 and was refused as "not a valid string". Booleans stay refused (true/1/True would be a guess)."""
    return str(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v


# The value of one environment variable (env_vars tables): text, numbers taken as their decimal text.
EnvValue = Annotated[str, BeforeValidator(_number_as_text)]


def _numeric_without_bool(annotation: Any) -> bool:
    """True when ``annotation`` accepts int or float but not bool (e.g. ``int``, ``float | None``)."""
    args = typing.get_args(annotation)
    kinds = set(args) if args else {annotation}
    return bool(kinds & {int, float}) and bool not in kinds


def _nul_at(value: Any, where: str = "") -> str | None:
    """Where a raw config value (string, path, or lists/tables of them, keys included) holds a NUL byte: ``where``
    extended by ``.key`` / ``[i]`` down to the offending string, or None when it holds none."""
    if isinstance(value, (str, Path)):
        return where if "\x00" in str(value) else None
    if isinstance(value, dict):
        for k, v in value.items():
            found = _nul_at(k, f"{where}.{k!r}") or _nul_at(v, f"{where}.{k}")
            if found is not None:
                return found
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            found = _nul_at(v, f"{where}[{i}]")
            if found is not None:
                return found
    return None


# An environment variable's name (never its value): letters, digits and '_', not starting with a digit.
ENV_VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# The command line's spelling of null (``--ckpt.keep-last None``). TOML has no null, so a file uses it too, and
# ``srl config show`` writes it for a null field whose default is not null.
NULL_SPELLING = "None"


def _null_spelling_means_null(annotation: Any) -> bool:
    """True when ``annotation`` takes null and no member of it could take the text ``"None"`` as a value (text,
    a path, a Literal naming it), so reading that text as null is unambiguous."""
    args = typing.get_args(annotation)
    if type(None) not in args:
        return False
    for member in args:
        if member in (str, Path) or (typing.get_origin(member) is Literal and NULL_SPELLING in typing.get_args(member)):
            return False
    return True


def models_in(annotation: Any) -> list[type[BaseModel]]:
    """The config table classes in a field's annotation: itself, or the models inside a union, Optional or list."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in models_in(arg)]


def _is_table(field: Any) -> bool:
    """Whether a model field holds a config table (a ``BaseModel``, possibly in a union) rather than plain data."""
    return field is not None and bool(models_in(field.annotation))


class Section(BaseModel):
    """Base of every config table: unknown keys are errors; values are validated on assignment too."""

    # allow_inf_nan=False: no float field has a meaning for inf or NaN (a NaN threshold never trips, an inf scale
    # makes every update NaN), so TOML's inf/nan are refused everywhere, naming the field.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _no_nul_bytes(cls, data: Any) -> Any:
        # No path, name, argument or environment value can hold a NUL byte (the OS refuses them); caught here, a
        # config names the field instead of failing later with "embedded null byte" from a filesystem call.
        # Nested tables check their own keys when they are validated.
        if isinstance(data, dict):
            for key, value in data.items():
                nested = isinstance(value, dict) and _is_table(cls.model_fields.get(key))  # checked by its own model
                found = _nul_at(key, repr(key)) or (None if nested else _nul_at(value, str(key)))
                if found is not None:
                    raise ValueError(f"{found}: contains a NUL byte (\\x00), which no path, name or argument can hold")
        return data

    @model_validator(mode="before")
    @classmethod
    def _raw_values(cls, data: Any) -> Any:
        # pydantic's lax mode turns true/false into 1/0 for numeric fields; a bare `--trainer.optim.lr` flag (value
        # forgotten) would then silently set lr = 1. A number field given a boolean is always a mistake.
        # "None" is null: without this, `keep_last = "None"` in a file would be a type error, and a reloaded
        # `srl config show` would have to leave the field out, which brings back its default (keep_last 2: old
        # checkpoints get deleted).
        # A table of a typed union (deployment, inference.deployment, trainer.loss, trainer.scheduler) given without
        # its `type` is the default variant, as when the table is absent: `--deployment.cpu-train-ranks 2` tunes
        # the default single_node deployment instead of failing on a missing tag.
        if isinstance(data, dict):
            for name, field in cls.model_fields.items():
                for key in {name, field.alias} - {None}:
                    if isinstance(data.get(key), bool) and _numeric_without_bool(field.annotation):
                        raise ValueError(
                            f"{key}: expects a number, got a boolean (a bare --flag means true: give the flag a value)"
                        )
                tag, value = field.discriminator, data.get(name)
                if value == NULL_SPELLING and _null_spelling_means_null(field.annotation):
                    data = {**data, name: None}
                elif isinstance(tag, str) and isinstance(value, dict) and tag not in value:
                    default = getattr(field.default, tag, None)
                    if default is not None:
                        data = {**data, name: {tag: default, **value}}
        return data


# ----------------------------------------------------------------------------------------------------------------
# Model and run
# ----------------------------------------------------------------------------------------------------------------
class ModelConfig(Section):
    name: str = "tiny-qwen3"
    """HF-format model directory, or a built-in alias (``tiny-qwen3``, ``smollm2-135m``) built on first use."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Weights dtype for trainer and inference. float32 on CPU keeps trainer/inference logprobs equal."""


class RunSection(Section):
    name: str | None = None
    """Run directory name under ``output_dir``. Default: ``<envs>--<model>--<short id>``. Letters, digits, ``._+-``."""

    @field_validator("name")
    @classmethod
    def _safe_name(cls, v: str | None) -> str | None:
        # '+' is allowed: the automatic name joins several env names with it (toolkit.launch.prepare.auto_run_name),
        # and it is safe in a directory name, a Slurm job name and an #SBATCH line.
        if v is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}", v):
            raise ValueError(
                "run.name must be 1-128 characters of letters, digits, '.', '_', '+' or '-' and start with a letter "
                "or digit (it becomes a directory name and a Slurm job name)"
            )
        return v


# ----------------------------------------------------------------------------------------------------------------
# Orchestrator
# ----------------------------------------------------------------------------------------------------------------
class SamplingConfig(Section):
    temperature: float = Field(1.0, ge=0.0, le=10.0)
    """Sampling temperature. 1.0 samples the policy itself (logprobs then match the trainer's)."""
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    """Nucleus truncation; below 1 biases sampling away from the trained policy."""
    top_k: int | None = Field(None, ge=0, le=512)
    """Top-k truncation (None or 0 = off)."""
    max_completion_tokens: int = Field(128, ge=1, le=1_000_000)
    """Tokens generated per turn at most."""
    seed: int | None = Field(None, ge=0, le=_MAX_SEED)
    """Sampling seed passed to the engine (None = engine's own randomness)."""


class SamplingOverride(Section):
    """Per-env sampling override: any field left unset inherits ``orchestrator.train.sampling``. A train env may not
    change temperature, top_p or top_k (the trainer scores each batch under one distribution); an eval env may."""

    temperature: float | None = Field(None, ge=0.0, le=10.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0, le=512)
    max_completion_tokens: int | None = Field(None, ge=1, le=1_000_000)
    seed: int | None = Field(None, ge=0, le=_MAX_SEED)


class RendererConfig(Section):
    name: str = "auto"
    """``auto`` = the model's chat template; ``plain`` = role/content lines (base models); ``hermes`` = the chat
    template with tools written in the Hermes text format (templates that ignore tools). See toolkit.models.renderer."""
    import_path: str | None = None
    """``package.module:Class`` of a custom renderer (overrides ``name``)."""


class BufferConfig(Section):
    online_difficulty_filtering: bool = False
    """Drop groups without learning signal (all rewards equal, or mean outside the thresholds)."""
    easy_threshold: float | None = None
    """Drop a group whose mean reward is >= this (continuous rewards). None: only exact all-equal groups."""
    hard_threshold: float | None = None
    """Drop a group whose mean reward is <= this (continuous rewards)."""
    oversampling_factor: float = Field(1.0, ge=1.0, le=16.0)
    """Sample this many times the needed groups so filtering still fills a batch."""


# Algorithms whose signal is a reference model's logprobs on the sampled tokens, not a reward advantage.
DISTILLATION = ("opd", "opsd")


class TeacherConfig(Section):
    """``opd``'s teacher: a frozen model behind a vLLM server (the only server that returns prompt logprobs), which
    scores the policy's own sampled tokens. One of three sources: an endpoint (``name`` + ``base_url``), an
    ``srl inference`` deployment (``deployment``), or a model this run serves itself (``serve = true``, ``name`` its
    directory: one more engine in the run's plan, started and stopped with the run). It must use the policy's
    tokenizer (checked when the run starts)."""

    name: str | None = Field(None, min_length=1)
    """The model name the endpoint serves (its ``/v1/models`` id); with ``deployment``: read from it; with ``serve``:
    the model's directory (an HF model, e.g. an SFT run's ``model/``)."""
    base_url: str | None = Field(None, min_length=1, pattern=r"^https?://\S+$")
    """OpenAI-compatible base URL of the teacher's vLLM server, e.g. ``http://node12:8001/v1``."""
    deployment: str | None = Field(None, min_length=1)
    """Run directory of an ``srl inference`` deployment that serves the teacher (locally, or as its own Slurm job):
    the run waits for it like for ``inference.external`` and never loads weights into it."""
    serve: bool = False
    """Serve ``name`` in this run: a vLLM engine of its own (process ``teacher-<k>``) that the run waits for like
    its policy engines, never loads weights into, and stops with the run; a teacher that dies ends the run naming
    it. A single-node run places it on its node; a multi-node Slurm run on a node of its own, a heterogeneous
    component of the job."""
    tp: int = Field(1, ge=1, le=64)
    """``serve`` on GPU nodes: the teacher engine's tensor-parallel GPUs (single node: taken after the policy's and
    the trainer's; multi-node: of its own node). Unused on CPU."""
    api_key_var: str | None = None
    """Name of the environment variable that holds the endpoint's API key (never the key itself)."""
    max_concurrent: int = Field(32, ge=1, le=65536)
    """Scoring requests in flight at most."""
    timeout_s: float = Field(120.0, gt=0, le=_MAX_TIMEOUT_S)
    """Seconds one scoring request may take; a teacher that stays unreachable for three tries ends the run."""

    @field_validator("api_key_var")
    @classmethod
    def _var_name(cls, v: str | None) -> str | None:
        if v is not None and not ENV_VAR_NAME.fullmatch(v):
            raise ValueError(f"api_key_var must name an environment variable (letters, digits, _), got {v!r}")
        return v

    @model_validator(mode="after")
    def _one_source(self) -> TeacherConfig:
        given = [
            k for k, on in (("base_url", self.base_url), ("deployment", self.deployment), ("serve", self.serve)) if on
        ]
        if len(given) != 1:
            raise ValueError(
                "a teacher is one of: an endpoint (name and base_url), a deployment (its run directory), or a model "
                f"this run serves (serve = true and name = its directory); {' and '.join(given) or 'none'} set"
            )
        if self.base_url is not None and self.name is None:
            raise ValueError("a teacher endpoint needs the model name it serves (name)")
        if self.serve:
            if self.name is None:
                raise ValueError("a served teacher needs its model directory (name)")
            if self.api_key_var is not None:
                raise ValueError("api_key_var is for a teacher endpoint; the teacher this run serves takes no key")
            if "{" in self.name or "}" in self.name:
                raise ValueError(f"a served teacher's directory may not contain braces: {self.name!r}")
        return self

    @model_validator(mode="before")
    @classmethod
    def _served_directory(cls, data: Any) -> Any:
        """One spelling per served teacher directory, the same in every process of the run (which may start
        elsewhere): absolute and normalised, a relative one taken from where srl runs."""
        if isinstance(data, dict) and data.get("serve") is True and isinstance(data.get("name"), str) and data["name"]:
            data = {**data, "name": os.path.normpath(os.path.abspath(os.path.expanduser(data["name"])))}
        return data


class AlgoConfig(Section):
    """The training signal of an env's rollouts (prime-rl's ``[orchestrator.train.algo]``)."""

    type: Literal["grpo", "max_rl", "opd", "opsd"] = "grpo"
    """``grpo``: advantage = reward - group mean; ``max_rl``: (reward - group mean) / group mean; ``opd``: on-policy
    distillation, no advantage: the teacher's logprobs of the sampled tokens train the policy (reverse KL);
    ``opsd``: self-distillation, the same with the policy itself as teacher, shown a demonstration of the task."""
    length_penalty: float = Field(0.0, ge=0.0, le=1.0)
    """Subtract ``length_penalty * completion_tokens / max_completion_tokens`` from the reward before advantages."""
    teacher: TeacherConfig | None = None
    """``opd`` only: the frozen model the policy distils from."""
    top_k: int = Field(0, ge=0, le=20)
    """``opd``/``opsd``: 0 trains on the reference's logprob of each sampled token (a one-sample estimate of the
    reverse KL); k > 0 asks the reference for its k most likely tokens at every position and trains on the reverse
    KL over those k tokens plus the rest as one bucket, exactly (no sampling noise). At most 20, vLLM's default
    ``--max-logprobs``."""
    demo_key: str = Field("answer", min_length=1)
    """``opsd``: the task data field that holds the demonstration (e.g. the reference ``answer``)."""
    template: str = "A correct reply to the next request is: {demonstration}"
    """``opsd``: the system message, placed before the prompt, that shows the policy the demonstration."""

    @model_validator(mode="after")
    def _teacher_with_opd(self) -> AlgoConfig:
        if self.type == "opd" and self.teacher is None:
            raise ValueError(
                "type 'opd' needs a teacher: set the algo's teacher (name and base_url, a deployment, or serve = true)"
            )
        if self.type != "opd" and self.teacher is not None:
            raise ValueError(f"a teacher is used by type 'opd' only, not {self.type!r}; remove it or set type = 'opd'")
        if self.type in DISTILLATION and self.length_penalty:
            raise ValueError(f"length_penalty shapes rewards into advantages; {self.type!r} trains without advantages")
        if self.top_k and self.type not in DISTILLATION:
            raise ValueError(f"top_k is the reference's top tokens of a distilling algo, not of {self.type!r}")
        if self.type == "opsd" and "{demonstration}" not in self.template:
            raise ValueError("template must contain {demonstration}, where the task's demonstration goes")
        return self


class SelectConfig(Section):
    include: list[str] | None = None
    """Task ids to keep (None = all)."""
    exclude: list[str] = []
    """Task ids to drop."""
    shuffle: bool = False
    skip: int = Field(0, ge=0)
    limit: int | None = Field(None, ge=1)


class TasksetConfig(Section):
    """A taskset by id plus its own typed fields (extra keys are passed to the taskset, which validates them)."""

    model_config = ConfigDict(extra="allow", validate_assignment=True)
    id: str = Field(min_length=1)
    """Built-in id (``reverse-text``, ``alphabet-sort``, ``arith``) or an importable module exporting one Taskset."""
    split: Literal["train", "test"] = "train"
    seed: int = Field(0, ge=0, le=_MAX_SEED)
    """Seed of the taskset's deterministic task generation / ordering."""
    select: SelectConfig = SelectConfig()


class RuntimeConfig(Section):
    """verifiers' runtime of an env's episodes (handed to the task's setup, finalize and scoring). Fields beyond
    these (``image``, ``workdir``, ``allow``, ...) pass to verifiers' runtime config, which validates them."""

    model_config = ConfigDict(extra="allow", validate_assignment=True)
    type: Literal["subprocess", "local", "docker", "podman", "apptainer", "prime", "modal", "e2b"] = "subprocess"
    """Where harness programs run."""
    cpu: float | None = Field(None, gt=0, le=1024)
    """CPUs per sandbox."""
    memory: float | None = Field(None, gt=0, le=4096)
    """Memory per sandbox, GiB."""


class HarnessConfig(Section):
    id: str = "default"
    """``default`` = the plain chat harness (verifiers' ``null``)."""
    runtime: RuntimeConfig = RuntimeConfig()


class TimeoutConfig(Section):
    """Per-stage timeouts, seconds. Every remote stage is bounded (seed: "Bound every remote stage")."""

    setup: float = Field(120.0, gt=0, le=_MAX_TIMEOUT_S)
    rollout: float = Field(600.0, gt=0, le=_MAX_TIMEOUT_S)
    finalize: float = Field(120.0, gt=0, le=_MAX_TIMEOUT_S)
    scoring: float = Field(120.0, gt=0, le=_MAX_TIMEOUT_S)


class PoolConfig(Section):
    type: Literal["static", "elastic"] = "static"
    max_workers: int = Field(1, ge=1, le=4096)
    """Env-server worker processes."""
    multiplex: int = Field(1, ge=1, le=65536)
    """Rollouts sharing one interception tunnel."""


class EnvConfig(Section):
    """One ``[[orchestrator.train.env]]`` entry (native v1 shape, or legacy v0 bridge with ``id``/``args``)."""

    name: str | None = None
    """Unique env name; defaults to the taskset id."""
    ratio: float | None = Field(None, gt=0)
    """Relative sampling weight; set on every train env or on none."""
    taskset: TasksetConfig | None = None
    harness: HarnessConfig = HarnessConfig()
    timeout: TimeoutConfig = TimeoutConfig()
    max_turns: int = Field(1, ge=1, le=10_000)
    max_total_tokens: int = Field(4096, ge=1, le=10_000_000)
    """Prompt + all completions of one rollout, tokens."""
    retries: int = Field(2, ge=0, le=100)
    """Retries of transient failures (provider, sandbox, tunnel) per rollout."""
    pool: PoolConfig = PoolConfig()
    sampling: SamplingOverride | None = None
    group_size: int | None = Field(None, ge=1, le=4096)
    algo: AlgoConfig | None = None
    """A train env's own algorithm (e.g. ``opd`` beside ``grpo`` envs); unset: ``orchestrator.train.algo``."""
    address: str | None = None
    """``host:port`` of an externally managed env server (srl then starts none)."""
    # Legacy v0 bridge. Accepted, labelled legacy in the resolved config.
    id: str | None = None
    args: dict[str, Any] | None = None
    legacy: bool = False

    @property
    def env_name(self) -> str:
        if self.name:
            return self.name
        if self.taskset is not None:
            return self.taskset.id
        return self.id or "env"


class EvalEnvConfig(EnvConfig):
    num_examples: int = Field(20, ge=1, le=1_000_000)
    """Held-out tasks evaluated each time."""


class TrainSection(Section):
    sampling: SamplingConfig = SamplingConfig()
    algo: AlgoConfig = AlgoConfig()
    env: list[EnvConfig] = Field(default_factory=list)


class EvalSection(Section):
    interval: int = Field(0, ge=0)
    """Evaluate every this many steps (0 = only the step-0 baseline when eval envs exist)."""
    env: list[EvalEnvConfig] = Field(default_factory=list)
    sampling: SamplingConfig | None = None
    """Eval sampling (default: the train sampling)."""
    seed: int | None = Field(None, ge=0, le=_MAX_SEED)
    """Engine seed of the eval draws: task i's rollout j samples with ``seed + i * k + j`` at every eval point, so
    two points differ by the policy, not by the luck of the draw. None: the eval sampling's own ``seed`` when set,
    else the engine's randomness. Not with vLLM on CPU: it fails a seeded request whose prompt it prefills in
    chunks (torch's CPU generators keep no offset), which many concurrent eval requests make likely."""


def off_policy_bound(max_async_level: int, max_off_policy_steps: int | None, update_weights: bool) -> int | None:
    """Policy versions a group's rollouts may lag the step that trains them before the group is dropped:
    ``max_off_policy_steps``, else ``max_async_level``; None (no bound) when weights are never updated (the negative
    control, whose every rollout comes from the first policy). Takes the fields' values so that offline tools
    reading a resolved config as JSON apply the orchestrator's own rule."""
    if not update_weights:
        return None
    return max_off_policy_steps if max_off_policy_steps is not None else max_async_level


class OrchestratorConfig(Section):
    training_mode: Literal["rl", "sft"] = "rl"
    """``rl``: rollouts train the policy. ``sft`` (set by ``srl sft`` for its online eval): no training rollouts;
    the orchestrator only evaluates the policy versions an SFT trainer broadcasts at its eval steps."""
    batch_size: int = Field(64, ge=1, le=1_000_000)
    """Rollouts per training step (whole groups)."""
    group_size: int = Field(8, ge=1, le=4096)
    """Rollouts per task (group-relative advantage)."""
    max_async_level: int = Field(1, ge=0, le=64)
    """Off-policy bound in steps: batch n is sampled with policy version >= n - 1 - max_async_level."""
    max_concurrent: int = Field(64, ge=1, le=1_000_000)
    """In-flight rollouts at most."""
    constant_trainer_batch_size: bool = True
    """Keep every trainer batch at exactly ``batch_size`` rollouts after filtering (oversample to fill)."""
    max_off_policy_steps: int | None = Field(None, ge=0)
    """Drop rollouts older than this many policy versions (default: max_async_level)."""
    renderer: RendererConfig = RendererConfig()
    train: TrainSection = TrainSection()
    buffer: BufferConfig = BufferConfig()
    eval: EvalSection = EvalSection()
    env_vars: dict[str, EnvValue] = {}
    update_weights: bool = True
    """Debug: when false the orchestrator never reloads new policy weights into inference (negative control)."""

    def off_policy_bound(self) -> int | None:
        """Policy versions a group's rollouts may lag the step that trains them (:func:`off_policy_bound`)."""
        return off_policy_bound(self.max_async_level, self.max_off_policy_steps, self.update_weights)

    def env_algo(self, env: EnvConfig) -> AlgoConfig:
        """The algorithm that trains ``env``'s rollouts: its own ``algo`` or the run's ``train.algo``."""
        return env.algo if env.algo is not None else self.train.algo

    def distilling_envs(self) -> list[tuple[str, EnvConfig, AlgoConfig]]:
        """``(field path of the algo, env, algo)`` of every train env that trains by distillation (``opd``,
        ``opsd``), in config order; the path is the env's own ``algo`` when it sets one."""
        out = []
        for i, env in enumerate(self.train.env):
            algo = self.env_algo(env)
            if algo.type in DISTILLATION:
                field = f"orchestrator.train.env[{i}].algo" if env.algo is not None else "orchestrator.train.algo"
                out.append((field, env, algo))
        return out

    def served_teachers(self) -> list[TeacherConfig]:
        """The ``opd`` teachers this run serves itself (``teacher.serve``), one per model directory (the first env's
        section), in the order of :meth:`distilling_envs`: teacher ``k`` is the plan's process ``teacher-<k>``, whose
        URL reaches the orchestrator as ``SRL_TEACHER_URL_<k>``."""
        out: dict[str, TeacherConfig] = {}
        for _field, _env, algo in self.distilling_envs():
            t = algo.teacher
            if t is not None and t.serve:
                out.setdefault(t.name, t)  # type: ignore[arg-type]
        return list(out.values())

    def served_teacher_index(self, name: str) -> int:
        """``k`` of the served teacher whose directory is ``name`` (:meth:`served_teachers`); ValueError if none."""
        return [t.name for t in self.served_teachers()].index(name)

    def env_entries(self) -> list[tuple[str, EnvConfig]]:
        """Every train env, then every eval env, with its field path (``orchestrator.train.env[0]``)."""
        sections = (("train", self.train.env), ("eval", self.eval.env))
        return [(f"orchestrator.{s}.env[{i}]", e) for s, envs in sections for i, e in enumerate(envs)]


# ----------------------------------------------------------------------------------------------------------------
# Trainer
# ----------------------------------------------------------------------------------------------------------------
class OptimConfig(Section):
    type: Literal["adamw"] = "adamw"
    lr: float = Field(1e-6, gt=0, le=1.0)
    weight_decay: float = Field(0.0, ge=0, le=1.0)
    betas: tuple[float, float] = (0.9, 0.999)
    max_norm: float = Field(1.0, gt=0)
    """Gradient clipping (global L2 norm)."""
    max_nonfinite_steps: int = Field(3, ge=1)
    """A step whose loss or gradient is NaN/inf skips its update; this many in a row stop the trainer (diverged)."""

    @field_validator("betas")
    @classmethod
    def _betas(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not all(0.0 <= b < 1.0 for b in v):
            raise ValueError("betas must both be in [0, 1)")
        return v


class ConstantScheduler(Section):
    type: Literal["constant"] = "constant"


class LinearWarmupScheduler(Section):
    type: Literal["linear_warmup"] = "linear_warmup"
    warmup_steps: int = Field(10, ge=1)


class LinearScheduler(Section):
    """Linear warm-up over ``warmup_steps``, then linear decay to ``min_lr_ratio * lr`` at ``max_steps``."""

    type: Literal["linear"] = "linear"
    warmup_steps: int = Field(0, ge=0)
    min_lr_ratio: float = Field(0.0, ge=0, le=1)


class CosineScheduler(Section):
    """Linear warm-up over ``warmup_steps``, then half a cosine down to ``min_lr_ratio * lr`` at ``max_steps``."""

    type: Literal["cosine"] = "cosine"
    warmup_steps: int = Field(0, ge=0)
    min_lr_ratio: float = Field(0.0, ge=0, le=1)


SchedulerConfig = Annotated[
    ConstantScheduler | LinearWarmupScheduler | LinearScheduler | CosineScheduler, Field(discriminator="type")
]


class IPOLoss(Section):
    type: Literal["ipo"] = "ipo"
    eps: float = Field(0.3, gt=0, le=10)
    """Mask a token when |pi_train(y) - pi_infer(y)| > eps (probabilities)."""
    adv_tau: float = Field(1.0, gt=0)
    """Advantage temperature."""


class IcePopLoss(Section):
    type: Literal["icepop"] = "icepop"
    ratio_low: float = Field(0.2, gt=0)
    ratio_high: float = Field(5.0, gt=0)
    """Tokens whose train/inference probability ratio lies outside [ratio_low, ratio_high] are masked."""
    adv_tau: float = Field(1.0, gt=0)
    """Advantage temperature."""

    @model_validator(mode="after")
    def _band(self) -> IcePopLoss:
        # The band must hold ratio 1 (trainer and engine agree): otherwise every on-policy token is masked and the
        # run trains on nothing.
        if not self.ratio_low < 1.0 < self.ratio_high:
            raise ValueError(
                f"ratio_low ({self.ratio_low}) < 1 < ratio_high ({self.ratio_high}) is required: "
                "tokens whose ratio is 1 (on-policy) must not be masked"
            )
        return self


LossConfig = Annotated[IPOLoss | IcePopLoss, Field(discriminator="type")]


class LoraConfig(Section):
    rank: int = Field(8, ge=1, le=512)
    """Adapter rank r. At most 512, vLLM 0.32's largest ``--max-lora-rank`` (the engines serve the adapter)."""
    alpha: float = Field(16.0, gt=0)
    """Scale numerator: the update is ``(alpha / rank) * B A x``."""
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] = ["q_proj", "k_proj", "v_proj", "o_proj"]
    """Linear layers of each decoder layer to adapt (peft names; a dotted suffix such as ``self_attn.q_proj`` is
    allowed). Checked against the model family's projections (``toolkit.preflight.lora.LORA_TARGETS``)."""


class TrainerModelConfig(Section):
    lora: LoraConfig | None = None


class TrainerConfig(Section):
    optim: OptimConfig = OptimConfig()
    scheduler: SchedulerConfig = ConstantScheduler()
    loss: LossConfig = IPOLoss()
    micro_batch_size: int = Field(1, ge=1, le=4096)
    """Packed rows per micro-batch."""
    seq_len: int = Field(2048, ge=8, le=1_048_576)
    """Most tokens per packed row (and so the longest sample the trainer takes). The trainer packs each batch at
    the row width, up to this, with the least estimated compute (toolkit.trainer.packing.row_width)."""
    model: TrainerModelConfig = TrainerModelConfig()
    tp: int = Field(1, ge=1, le=64)
    """Tensor-parallel degree of the trainer."""
    cp: int = Field(1, ge=1, le=64)
    """Context-parallel degree of the trainer."""
    batch_timeout_s: float = Field(3600.0, gt=0, le=_MAX_TIMEOUT_S)
    """How long the trainer waits for the orchestrator's next batch, seconds."""
    env_vars: dict[str, EnvValue] = {}


# ----------------------------------------------------------------------------------------------------------------
# Inference
# ----------------------------------------------------------------------------------------------------------------
class SingleNodeInference(Section):
    type: Literal["single_node"] = "single_node"
    num_replicas: int = Field(1, ge=1, le=64)
    """Engines on the inference node(s); more than one puts a router in front."""


class MultiNodeInference(Section):
    type: Literal["multi_node"] = "multi_node"
    num_nodes: int = Field(2, ge=1, le=100_000)
    """Inference nodes per replica (island)."""


class DisaggregatedInference(Section):
    type: Literal["disaggregated"] = "disaggregated"
    prefill_nodes_per_replica: int = Field(1, ge=1, le=100_000)
    num_prefill_replicas: int = Field(1, ge=1, le=100_000)
    decode_nodes_per_replica: int = Field(1, ge=1, le=100_000)
    num_decode_replicas: int = Field(1, ge=1, le=100_000)
    kv_connector: Literal["auto", "NixlConnector", "ExampleConnector", "LMCacheConnectorV1", "MooncakeConnector"] = (
        "auto"
    )
    """``auto`` = NixlConnector on GPU sites, ExampleConnector (shared files in the run's scratch) on CPU."""
    prefill_env_vars: dict[str, EnvValue] = {}
    decode_env_vars: dict[str, EnvValue] = {}


def implied_infer_nodes(infer: Any) -> int:
    """Nodes one inference replica of ``[inference.deployment]`` needs: 1 (single_node), ``num_nodes``
    (multi_node), prefill plus decode nodes (disaggregated: from nodes per replica, never from worker counts)."""
    if infer.type == "multi_node":
        return int(infer.num_nodes)
    if infer.type == "disaggregated":
        return (
            infer.prefill_nodes_per_replica * infer.num_prefill_replicas
            + infer.decode_nodes_per_replica * infer.num_decode_replicas
        )
    return 1


def infer_replica_fields(cfg: Any, replicas: int) -> dict[str, int]:
    """The ``[deployment]`` fields of run config ``cfg`` (multi_node) with ``replicas`` inference replicas: the
    replica count, the inference nodes they imply, and an explicit total node count moved by the same difference,
    so the changed config passes the same validation as ``cfg``."""
    dep = cfg.deployment
    per = implied_infer_nodes(cfg.inference.deployment)
    out = {"num_infer_replicas": replicas, "num_infer_nodes": per * replicas}
    if dep.nodes is not None:
        out["nodes"] = dep.nodes - per * (dep.num_infer_replicas - replicas)
    return out


InferenceDeploymentConfig = Annotated[
    SingleNodeInference | MultiNodeInference | DisaggregatedInference, Field(discriminator="type")
]


class RouterConfig(Section):
    policy: Literal[
        "sticky_least_loaded", "round_robin", "random", "cache_aware", "power_of_two", "consistent_hash", "kv_aware"
    ] = "sticky_least_loaded"
    request_timeout_s: float = Field(600.0, gt=0, le=_MAX_TIMEOUT_S)
    """Per-request timeout at the router (its own default of 1800 s lets a hung engine stall requests)."""
    health_check_interval_s: float = Field(10.0, gt=0, le=3600)


class InferenceConfig(Section):
    vllm: dict[str, Any] = {}
    """Passed verbatim to the vLLM server (any ``vllm serve`` argument, snake or kebab case)."""
    deployment: InferenceDeploymentConfig = SingleNodeInference()
    router: RouterConfig = RouterConfig()
    env_vars: dict[str, EnvValue] = {}
    startup_timeout_s: float = Field(900.0, gt=0, le=_MAX_TIMEOUT_S)
    """Bound on engine start-up until /health answers, seconds (also bounds each restart, and how long the
    orchestrator holds generation requests for an engine that is restarting)."""
    max_restarts: int = Field(2, ge=0, le=1000)
    """Restarts of a crashed inference engine before the run ends naming it; 0 = an engine death ends the run.
    A restarted engine gets the newest STABLE policy weights from the orchestrator before it serves rollouts."""
    restart_window_s: float | None = Field(3600.0, gt=0, le=_MAX_TIMEOUT_S)
    """Only restarts within this many seconds count toward ``max_restarts`` (None = the whole attempt), so rare
    crashes over a long run are survived while a crash loop still ends the run."""
    external: str | None = None
    """Run directory of a separately submitted inference deployment to use instead of starting one."""


# ----------------------------------------------------------------------------------------------------------------
# Placement and Slurm
# ----------------------------------------------------------------------------------------------------------------
class SingleNodeDeployment(Section):
    type: Literal["single_node"] = "single_node"
    gpus_per_node: int = Field(0, ge=0, le=64)
    """GPUs per node (0 = CPU-only)."""
    num_train_gpus: int = Field(0, ge=0, le=64)
    num_infer_gpus: int = Field(0, ge=0, le=64)
    cpu_train_ranks: int = Field(1, ge=1, le=64)
    """CPU-only node (gpus_per_node = 0): trainer processes (gloo ranks, FSDP2) under torchrun. With GPUs the
    trainer has one rank per GPU of num_train_gpus."""


_MAX_INFER_NODES = 100_000


def slurm_time_text(v: Any) -> Any:
    """A Slurm time limit as the text sbatch takes: a bare number is minutes to sbatch, and an unquoted 01:00:00 in
    TOML is a time of day; both mean a limit. Anything else is left for the field's own validation."""
    if isinstance(v, int) and not isinstance(v, bool):
        return str(v)
    if isinstance(v, datetime.time):
        return v.strftime("%H:%M:%S")
    return v


class ElasticConfig(Section):
    """``[deployment.elastic]``: inference replicas that join a running run as their own Slurm jobs
    (``srl inference join RUN``) and may leave at any time (time limit, preemption, scancel). Its presence puts a
    router in front of the run's engines, so replicas can be added to and removed from it."""

    partition: str | None = None
    """Partition of the replica jobs (e.g. a preemptible one); default: ``slurm.partition``."""
    time: str = "01:00:00"
    """Time limit of each replica job, in any Slurm form."""
    qos: str | None = None
    """QOS of the replica jobs; default: ``slurm.qos``."""
    max_replicas: int = Field(4, ge=1, le=1024)
    """Most replica jobs a run has at once (``srl inference join`` refuses more)."""
    replicas: int = Field(0, ge=0, le=1024)
    """Replica jobs ``srl rl`` submits with the run (each starts once the run's job has started); more can join
    later with ``srl inference join``. At most ``max_replicas``."""

    _time_as_text = field_validator("time", mode="before")(lambda cls, v: slurm_time_text(v))

    @model_validator(mode="after")
    def _replicas_within_max(self) -> ElasticConfig:
        if self.replicas > self.max_replicas:
            raise ValueError(f"replicas ({self.replicas}) exceeds max_replicas ({self.max_replicas})")
        return self


class MultiNodeDeployment(Section):
    type: Literal["multi_node"] = "multi_node"
    elastic: ElasticConfig | None = None
    """Replicas that join the run as their own jobs (``[deployment.elastic]``); None: the run's engines only."""
    gpus_per_node: int = Field(8, ge=0, le=64)
    num_train_nodes: int = Field(1, ge=1, le=100_000)
    num_infer_nodes: int | None = Field(None, ge=1, le=_MAX_INFER_NODES)
    """Inference nodes in all; default: what ``[inference.deployment]`` needs per replica (a disaggregated
    layout: its prefill and decode nodes) x ``num_infer_replicas``. A value given must equal that."""
    num_infer_replicas: int = Field(1, ge=1, le=100_000)
    """Inference islands (each with the nodes ``[inference.deployment]`` implies)."""
    nodes_per_fsdp_group: int | None = Field(None, ge=1)
    """Trainer nodes per FSDP (sharding) group; None = all trainer nodes form one group."""
    orchestrator: Literal["own_node", "with_inference", "with_trainer"] = "with_inference"
    """Where the orchestrator runs: its own node, or co-located on the first inference / trainer node."""
    orchestrator_partition: str | None = None
    """Run the orchestrator as a separate heterogeneous-job component on this (CPU) partition."""
    nodes: int | None = Field(None, ge=1)
    """Explicit total node count; must equal the derived one (a check, never a trim)."""
    trainer_rendezvous_timeout_s: int = Field(300, gt=0, le=int(_MAX_TIMEOUT_S))
    """How long the trainer nodes' torchrun agents wait for each other, seconds (torchrun's ``join_timeout``). A
    node that has not joined by then fails the run with a message naming it, instead of waiting to the time
    limit. Whole seconds: torchrun reads it as an integer."""


DeploymentConfig = Annotated[SingleNodeDeployment | MultiNodeDeployment, Field(discriminator="type")]


class SlurmConfig(Section):
    job_name: str | None = None
    """Default: the run name."""
    partition: str | None = None
    account: str | None = None
    time: str = "04:00:00"
    """Slurm time limit in any Slurm form: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S."""

    _time_as_text = field_validator("time", mode="before")(lambda cls, v: slurm_time_text(v))

    qos: str | None = None
    constraint: str | None = None
    nodelist: str | None = None
    exclude: str | None = None
    requeue: bool = True
    signal: Literal["USR1", "USR2", "TERM", "INT", "HUP", "URG"] = "USR2"
    """Pre-timeout signal sent to the batch shell (``--signal=B:<sig>@<lead>``). Not USR1 with NCCL,
    which handles SIGUSR1 itself."""
    signal_lead_s: int = Field(600, ge=1, le=int(_MAX_TIMEOUT_S))
    """Seconds before the time limit at which the signal is sent."""
    checkpoint_grace_s: int = Field(300, ge=1, le=int(_MAX_TIMEOUT_S))
    """How long the batch shell waits for the requested checkpoint before requeueing/ending, seconds."""
    extra_directives: list[str] = []
    """Extra ``#SBATCH`` options, e.g. ``--mail-type=END``."""
    pre_run_command: str | None = None
    """A command run once on each node before the components start (through a script file, never ``bash -c``)."""
    template_path: Path | None = None
    """Your own Jinja2 template, rendered with the same variables."""
    secret_env_vars: list[str] = []
    """Names (never values) of environment variables to export to the job, e.g. ``WANDB_API_KEY``."""


# ----------------------------------------------------------------------------------------------------------------
# Checkpoints, resume, weights, monitors
# ----------------------------------------------------------------------------------------------------------------
class CkptConfig(Section):
    interval: int | None = Field(None, ge=1)
    """Checkpoint every this many steps (None = only at the end and on stop requests)."""
    keep_last: int | None = Field(2, ge=1)
    """Keep this many newest complete checkpoints (None = all)."""
    keep_interval: int | None = Field(None, ge=1)
    """Also keep every checkpoint whose step is a multiple of this."""


class ResumeConfig(Section):
    step: int | None = Field(None, ge=1)
    """Resume from this step (default: the newest complete checkpoint)."""
    dir: Path | None = None
    """Resume from another run's directory (fork)."""


class WeightBroadcastConfig(Section):
    type: Literal["filesystem"] = "filesystem"
    keep: int | None = Field(None, ge=1)
    """Recent broadcasts kept; default and minimum ``max_async_level + 1``, so an engine up
    to ``max_async_level`` steps behind can still load the policy it needs."""


class StopCriteria(Section):
    """``[monitors.stop]``: the orchestrator checkpoints and stops the run when one of these trips.

    Evaluated by :class:`toolkit.run.stop.StopMonitor` (the same code replays them in reports);
    ``max_empty_steps`` by the orchestrator's zero-signal guard."""

    max_errored_share: float | None = Field(0.5, ge=0, le=1)
    """Stop when errored rollouts exceed this share of a step ..."""
    errored_patience_steps: int = Field(5, ge=1)
    """... for this many consecutive steps."""
    max_mismatch_kl: float | None = Field(None, gt=0)
    """Stop when trainer-inference mismatch KL exceeds this ..."""
    mismatch_kl_patience_steps: int = Field(2, ge=1)
    """... for this many consecutive trainer steps."""
    reward_collapse_fraction: float | None = Field(None, ge=0, le=1)
    """Stop when the mean reward falls below this fraction of the best so far ..."""
    reward_collapse_patience_steps: int = Field(5, ge=1)
    """... for this many consecutive steps."""
    max_empty_steps: int | None = Field(10, ge=1)
    """Stop after this many consecutive steps whose groups all had identical rewards (no signal)."""

    @property
    def enabled(self) -> bool:
        """Whether any metrics threshold is set (the zero-signal guard is not one)."""
        return any(v is not None for v in (self.max_errored_share, self.max_mismatch_kl, self.reward_collapse_fraction))


class WandbConfig(Section):
    """``[monitors.wandb]``: every ``metrics.jsonl`` line of the run in one W&B run (id = the srl run id; a sweep's
    points grouped by sweep name); W&B's files stay in ``<run>/wandb/``."""

    project: str | None = None
    """W&B project (default ``srl``)."""
    name: str | None = None
    """W&B run name (default the run directory's name)."""
    offline: bool = True
    """Write W&B's files only (compute nodes often have no internet); upload later with ``wandb sync``."""
    api_key_var: str = "WANDB_API_KEY"
    """Name of the environment variable holding the key (never the key itself)."""

    @field_validator("api_key_var")
    @classmethod
    def _var_name(cls, v: str) -> str:
        # A key pasted here would be a secret in the config; the value is never echoed back.
        if not ENV_VAR_NAME.fullmatch(v):
            raise ValueError(
                "must be the name of an environment variable (letters, digits, '_'; not starting with "
                "a digit), never the key itself"
            )
        return v


class MonitorsConfig(Section):
    file: bool = True
    """Append metrics to ``<run>/metrics.jsonl``."""
    wandb: WandbConfig | None = None
    stop: StopCriteria = StopCriteria()
    stall_timeout_s: float = Field(1800.0, gt=0, le=_MAX_TIMEOUT_S)
    """Progress watchdog: the supervisor ends the run (exit status 7) when a trainer rank or the orchestrator makes
    no progress (no new phase, step, batch or collected group) for this many seconds, or an engine does not answer
    /health for this long (it is restarted like a dead engine). The stuck processes' Python stacks go to their
    logs first. Phases known to be long get more (``stall_startup_factor``, ``stall_s_per_gib``)."""
    stall_startup_factor: float = Field(3.0, ge=1, le=1000)
    """The bound of start-up phases (model load, the first step of an attempt, which compiles) is
    ``stall_timeout_s`` times this."""
    stall_s_per_gib: float = Field(120.0, ge=0, le=_MAX_TIMEOUT_S)
    """Phases that move weights (checkpoint write, weight broadcast or update) get this many seconds more per GiB
    they move, on top of ``stall_timeout_s``: the bound grows with the model, no size is hard-coded. The admin call
    that loads a broadcast into an engine gets the same per GiB on top of its own 300 s."""
    stall_restarts: int = Field(1, ge=0, le=100)
    """On Slurm with ``slurm.requeue``: how many times a stall requeues the batch job, which restarts every role
    from the newest complete checkpoint (a hang that a restart clears costs one attempt, not the run); the stall
    after those ends the run (status 7). Counted per Slurm job (a later ``--resume`` submits a new one). 0: the
    first stall ends it. Local runs end on the first stall."""

    @model_validator(mode="after")
    def _wandb_mirrors_the_file(self) -> MonitorsConfig:
        # W&B receives the lines of metrics.jsonl (toolkit.trainer.wandb_mirror): without the file it gets nothing.
        if self.wandb is not None and not self.file:
            raise ValueError("monitors.wandb logs the lines of metrics.jsonl to W&B: it needs monitors.file = true")
        return self


# ----------------------------------------------------------------------------------------------------------------
# The whole run
# ----------------------------------------------------------------------------------------------------------------
class RLConfig(Section):
    """The resolved RL run config (canonical shape). Produced by :func:`toolkit.config.load_config`."""

    output_dir: Path = Path("outputs")
    """Parent of run directories (on the shared filesystem for Slurm sites)."""
    run: RunSection = RunSection()
    max_steps: int = Field(20, ge=1, le=10_000_000)
    """Trainer steps (policy updates) of the run."""
    seed: int = Field(0, ge=0, le=_MAX_SEED)
    """Seed of everything random in srl (task order, sampling, init)."""
    model: ModelConfig = ModelConfig()
    env_vars: dict[str, EnvValue] = {}
    """Environment for every process (lowest user layer)."""
    orchestrator: OrchestratorConfig = OrchestratorConfig()
    trainer: TrainerConfig = TrainerConfig()
    inference: InferenceConfig = InferenceConfig()
    deployment: DeploymentConfig = SingleNodeDeployment()
    slurm: SlurmConfig = SlurmConfig()
    site: str = "local"
    """Name of a file in ``site-configs/`` (``local`` = processes on this machine)."""
    ckpt: CkptConfig = CkptConfig()
    resume: ResumeConfig = ResumeConfig()
    weight_broadcast: WeightBroadcastConfig = WeightBroadcastConfig()
    monitors: MonitorsConfig = MonitorsConfig()
    notices: list[str] = []
    """What srl mapped from other shapes (legacy/hosted) while loading; informational."""

    @model_validator(mode="after")
    def _derive_infer_nodes(self) -> RLConfig:
        # Fills the one value left out; an explicit count is compared with this in the placement's topology,
        # where a mismatch is an error showing both numbers. Idempotent: a resolved config loads back the same.
        dep = self.deployment
        if isinstance(dep, MultiNodeDeployment) and dep.num_infer_nodes is None:
            per, infer = implied_infer_nodes(self.inference.deployment), self.inference.deployment
            if per * dep.num_infer_replicas > _MAX_INFER_NODES:
                # Assigned as is, the bound of num_infer_nodes fired naming a field the user never set.
                raise ValueError(
                    f"[inference.deployment] ({infer.type}) implies {per} node(s) per replica x "
                    f"{dep.num_infer_replicas} replica(s) (deployment.num_infer_replicas) = "
                    f"{per * dep.num_infer_replicas} inference nodes; at most {_MAX_INFER_NODES}"
                )
            dep.num_infer_nodes = per * dep.num_infer_replicas
        return self

    def env_pythonpath(self) -> list[str]:
        """The env workers' extra import path entries, in order, as their process sees them: the orchestrator's
        ``env_vars.PYTHONPATH`` when set, else the run's (a component's value replaces the run's in the process
        environment), split on ``os.pathsep`` with empty entries dropped; empty when neither sets one (the job
        then inherits the submitting shell's)."""
        value = self.orchestrator.env_vars.get("PYTHONPATH") or self.env_vars.get("PYTHONPATH") or ""
        return [p for p in value.split(os.pathsep) if p]
