"""The SFT run config (``srl sft``): prime-rl's SFT trainer shape, sharing every section it has in common with RL.

Top level: ``max_steps``, ``seed``, ``output_dir``, ``[run]``, ``[model]``, ``[data]`` (``name`` = a local
dataset, ``batch_size``, ``seq_len``, ``[data.columns]``), ``[loss_mask]``, ``[val]``, ``[renderer]``,
``[trainer]`` (``optim``, ``scheduler``, ``micro_batch_size``, ``model.lora``), ``[ckpt]``, ``[resume]``,
``[deployment]``, ``[inference]``, ``[slurm]``, ``site``, ``[monitors]``, ``[env_vars]``.

The sections shared with RL are the same classes as in :mod:`toolkit.config.model` (one default per knob).
:meth:`SFTConfig.launch_view` turns the config into the ``RLConfig`` that placement and submission read: an SFT run
is placed, submitted, supervised, followed and cancelled exactly like an RL run whose only role is the trainer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, PrivateAttr, ValidationError, model_validator

from . import LoadedConfig, name_sources, rules
from .compose import merge_layers
from .envpaths import absolute_env_paths
from .errors import ConfigError, pydantic_issues
from .model import (
    _MAX_SEED,
    CkptConfig,
    ConstantScheduler,
    DeploymentConfig,
    EnvValue,
    EvalSection,
    InferenceConfig,
    ModelConfig,
    MonitorsConfig,
    OptimConfig,
    OrchestratorConfig,
    RendererConfig,
    ResumeConfig,
    RLConfig,
    RunSection,
    SchedulerConfig,
    Section,
    SingleNodeDeployment,
    SlurmConfig,
    TrainerConfig,
    TrainerModelConfig,
)


class ColumnsConfig(Section):
    """``[data.columns]``: the dataset's own column names for each column srl reads (renamed at load time)."""

    prompt: str = "prompt"
    completion: str = "completion"
    messages: str = "messages"
    message_loss_mask: str = "message_loss_mask"
    tools: str = "tools"
    id: str = "id"
    """Column holding a sample id (recorded per step so a resumed run can be checked); row number when absent."""

    @model_validator(mode="after")
    def _distinct(self) -> ColumnsConfig:
        # Two roles read from one column would, e.g., train the prompt as its own reply, and nothing would fail.
        seen: dict[str, str] = {}
        for field, column in self.model_dump().items():
            if column in seen:
                raise ValueError(
                    f"{seen[column]} and {field} both name the column {column!r}; each role needs a column of its own"
                )
            seen[column] = field
        return self


class DataConfig(Section):
    """``[data]``: where the samples come from and how many a step takes."""

    name: Path
    """A local dataset: a ``.jsonl``/``.json`` or ``.parquet`` file, or a directory of such files (no hub here)."""
    type: Literal["sft"] = "sft"
    batch_size: int = Field(32, ge=1, le=1_000_000)
    """Samples per optimizer step (packed into rows of at most ``seq_len`` tokens)."""
    seq_len: int = Field(2048, ge=8, le=1_048_576)
    """Most tokens per packed row; a sample longer than this is an error naming its row (never truncated)."""
    shuffle: bool = True
    """Shuffle the samples each epoch (seeded by ``seed`` and the epoch number)."""
    columns: ColumnsConfig = ColumnsConfig()


class ValDataConfig(Section):
    """``[val.data]``: a validation dataset (same layouts and column names as ``[data]``)."""

    name: Path
    columns: ColumnsConfig = ColumnsConfig()


class ValConfig(Section):
    """``[val]``: cross-entropy on held-out samples every ``interval`` steps and at the end."""

    interval: int = Field(50, ge=1)
    data: ValDataConfig | None = None
    """Validation dataset; when absent, ``fraction`` of ``[data]`` is held out instead."""
    fraction: float = Field(0.05, gt=0, lt=1)
    """Share of the training rows held out when ``data`` is not given (at least one row, chosen by ``seed``)."""
    max_samples: int | None = Field(256, ge=1)
    """Validate on at most this many samples (None = all)."""


class LossMaskConfig(Section):
    """``[loss_mask]``: which roles' tokens contribute to the loss (a message mask column can only remove more)."""

    system: bool = False
    user: bool = False
    assistant: bool = True
    tool: bool = False


class SFTTrainerConfig(Section):
    """``[trainer]`` of an SFT run: the RL trainer's optimizer, schedule, micro-batching and LoRA settings."""

    optim: OptimConfig = OptimConfig(lr=1e-4)
    scheduler: SchedulerConfig = ConstantScheduler()
    micro_batch_size: int = Field(1, ge=1, le=4096)
    """Packed rows per forward/backward."""
    model: TrainerModelConfig = TrainerModelConfig()
    env_vars: dict[str, EnvValue] = Field(default_factory=dict)


class SFTConfig(Section):
    """The resolved SFT run config. Produced by :func:`toolkit.config.load_sft_config`."""

    output_dir: Path = Path("outputs")
    run: RunSection = RunSection()
    max_steps: int = Field(100, ge=1, le=10_000_000)
    """Optimizer steps of the run (``data.batch_size`` samples each; epochs repeat the data as needed)."""
    seed: int = Field(0, ge=0, le=_MAX_SEED)
    model: ModelConfig = ModelConfig()
    data: DataConfig
    loss_mask: LossMaskConfig = LossMaskConfig()
    val: ValConfig | None = None
    renderer: RendererConfig = RendererConfig()
    eval: EvalSection | None = None
    """Online eval: the shape of an RL run's ``[orchestrator.eval]`` (``interval``, ``[[eval.env]]``, ``sampling``).
    The base model is evaluated before step 1, then every ``interval`` steps and at the end, through vLLM on the
    trainer's current weights (the trainer broadcasts them at those steps)."""
    max_concurrent: int = Field(64, ge=1, le=1_000_000)
    """Online eval: rollouts in flight at once."""
    trainer: SFTTrainerConfig = SFTTrainerConfig()
    ckpt: CkptConfig = CkptConfig()
    resume: ResumeConfig = ResumeConfig()
    deployment: DeploymentConfig = SingleNodeDeployment()
    inference: InferenceConfig = InferenceConfig()
    slurm: SlurmConfig = SlurmConfig()
    site: str = "local"
    monitors: MonitorsConfig = MonitorsConfig()
    env_vars: dict[str, EnvValue] = Field(default_factory=dict)
    kind: Literal["sft"] = "sft"
    """Marks a resolved ``sft.json`` (the trainer runs the SFT loop for it)."""
    _origins: dict[str, str] = PrivateAttr(default_factory=dict)
    _warnings: list = PrivateAttr(default_factory=list)
    _notices: list = PrivateAttr(default_factory=list)

    @model_validator(mode="after")
    def _deployment_has_a_trainer(self) -> SFTConfig:
        dep = self.deployment
        if dep.type == "multi_node" and dep.orchestrator != "with_inference":
            raise ValueError("deployment.orchestrator: an SFT run has no orchestrator; leave it at 'with_inference'")
        return self

    @property
    def has_online_eval(self) -> bool:
        """Whether ``[eval]`` names envs (then inference and an eval-only orchestrator run beside the trainer)."""
        return self.eval is not None and bool(self.eval.env)

    def roles(self) -> tuple[str, ...]:
        """The roles placed for this run: the trainer alone, or everything when there is an online eval."""
        return ("inference", "router", "orchestrator", "trainer") if self.has_online_eval else ("trainer",)

    def launch_view(self) -> RLConfig:
        """The ``RLConfig`` that placement, rendering and submission read for this SFT run: the trainer, plus an
        eval-only orchestrator and inference when ``[eval]`` has envs (:meth:`roles`).

        Shared sections are passed through unchanged; the trainer's ``seq_len`` is the data's. Raises
        pydantic.ValidationError only if a shared section is inconsistent (it was validated already).
        """
        t = self.trainer
        return RLConfig(
            output_dir=self.output_dir,
            run=self.run,
            max_steps=self.max_steps,
            seed=self.seed,
            model=self.model,
            env_vars=self.env_vars,
            trainer=TrainerConfig(
                optim=t.optim,
                scheduler=t.scheduler,
                micro_batch_size=t.micro_batch_size,
                seq_len=self.data.seq_len,
                model=t.model,
                env_vars=t.env_vars,
            ),
            orchestrator=OrchestratorConfig(
                training_mode="sft",
                renderer=self.renderer,
                eval=self.eval or EvalSection(),
                max_concurrent=self.max_concurrent,
            ),
            inference=self.inference,
            deployment=self.deployment,
            slurm=self.slurm,
            site=self.site,
            ckpt=self.ckpt,
            resume=self.resume,
            monitors=self.monitors,
        )


# Where a field of the launch view comes from in the SFT config, for the paths the two spell differently
# (longest prefix first); every other path is the same in both.
_VIEW_TO_SFT = (
    ("orchestrator.max_concurrent", "max_concurrent"),
    ("orchestrator.renderer", "renderer"),
    ("orchestrator.eval", "eval"),
    ("trainer.seq_len", "data.seq_len"),
)


def _renamed(path: str, pairs) -> str:
    """``path`` with the first ``(old, new)`` prefix of ``pairs`` that covers it (whole path, or up to a ``.`` or
    ``[``) replaced by ``new``; unchanged when none does."""
    for old, new in pairs:
        if path == old or path.startswith((old + ".", old + "[")):
            return new + path[len(old) :]
    return path


def in_sft_terms(issues: list) -> list:
    """``issues`` (ConfigIssue) found on the launch view, renamed to the SFT config's field paths
    (``orchestrator.eval.env[0]`` -> ``eval.env[0]``, ``trainer.seq_len`` -> ``data.seq_len``; a comma-separated
    path item by item). Returns them."""
    for issue in issues:
        issue.path = ", ".join(_renamed(part.strip(), _VIEW_TO_SFT) for part in issue.path.split(","))
    return issues


def load_sft_config(files: list[Path], overrides: list[str] | None = None) -> SFTConfig:
    """Merge SFT TOML ``files`` left to right, apply dotted ``overrides``, validate the fields, then the same
    cross-field rules ``srl rl`` applies (:func:`toolkit.config.rules.check`, purpose "sft") on the launch view:
    Slurm directives, secrets, environment variable names, the deployment, eval envs.

    Relative ``data.name`` / ``val.data.name`` stay relative to the working directory (as ``output_dir`` does).
    Raises ConfigError listing every problem (SFT field path, allowed values, the file that set it). The rules'
    warnings are kept for :func:`launch_loaded`.
    """
    merged, origins, notices = merge_layers(files, overrides)
    try:
        cfg = SFTConfig.model_validate(merged)
    except ValidationError as e:
        raise ConfigError(name_sources(pydantic_issues(e, SFTConfig), origins)) from None
    try:
        absolute_env_paths(cfg)  # the job sees them from its run directory (toolkit.config.envpaths)
    except ConfigError as e:
        raise ConfigError(name_sources(e.issues, origins)) from None
    try:
        view = cfg.launch_view()
    except ValidationError as e:
        # The RL config's own checks (e.g. inference nodes derived from [inference.deployment]): named in the
        # SFT config's terms, not a traceback.
        raise ConfigError(name_sources(in_sft_terms(pydantic_issues(e, RLConfig)), origins)) from None
    found = rules.check(view, purpose="sft")
    if found.errors:
        raise ConfigError(name_sources(in_sft_terms(found.errors), origins))
    cfg._origins = origins
    cfg._warnings = name_sources(in_sft_terms(found.warnings), origins)
    cfg._notices = notices  # e.g. an overlay replacing a whole list: printed by the command before it runs
    return cfg


def launch_loaded(cfg: SFTConfig) -> LoadedConfig:
    """The launch view of ``cfg`` as a :class:`toolkit.config.LoadedConfig` (purpose "sft"), for
    :func:`toolkit.preflight.preflight`: its warnings so far, and field origins in the view's paths so a finding
    names the file that set the field. Map findings back with :func:`in_sft_terms`."""
    back = [(sft, view) for view, sft in _VIEW_TO_SFT]
    origins = {_renamed(path, back): src for path, src in cfg._origins.items()}
    return LoadedConfig(
        cfg.launch_view(), warnings=list(cfg._warnings), notices=list(cfg._notices), purpose="sft", origins=origins
    )


__all__ = [
    "ColumnsConfig",
    "DataConfig",
    "LossMaskConfig",
    "SFTConfig",
    "SFTTrainerConfig",
    "ValConfig",
    "in_sft_terms",
    "launch_loaded",
    "load_sft_config",
]
