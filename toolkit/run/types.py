"""The records a run produces: generations -> rollouts -> training samples, and the sampling settings of a request.

Plain dataclasses (no torch), kept with the run directory because they are what its batches and rollout store hold
and every role passes them on: the policy client returns generations, env workers and the orchestrator build
rollouts, the trainer reads training samples from batches and offline analysis reads rollouts back from the store.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

# Error classes of a rollout failure: each names the boundary where it happened (what to fix differs per class).
ErrorClass = Literal[
    "ProviderError",  # inference endpoint, model, capacity or request dialect
    "HarnessError",  # harness program install/launch/non-zero exit
    "ToolsetError",  # tool server start-up, reachability, call behaviour
    "UserError",  # simulated-user server failures
    "SandboxError",  # runtime capacity, lifecycle, filesystem, network
    "TunnelError",  # interception tunnel failures
    "TaskError",  # task setup, finalize or scoring implementation
    "RewardSkippedError",  # scoring finished with a reward or metric unscored (would read as a silent 0)
]

# Transient classes: retried with backoff. Deterministic classes are never retried (a retry cannot fix a
# deterministic taskset or harness error; it only hides it and burns the allocation).
TRANSIENT_ERRORS: frozenset[str] = frozenset({"ProviderError", "SandboxError", "TunnelError"})


@dataclass
class SamplingParams:
    """Sampling settings of one request. ``top_k`` None or 0 means no top-k truncation; tokens are counts."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    max_tokens: int = 128
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None


@dataclass
class Generation:
    """One completion returned by the policy, as token ids (never re-tokenised text).

    ``logprobs[i]`` is the sampling logprob (natural log) of ``token_ids[i]`` under the served policy.
    ``finish_reason`` is "stop" or "length". ``policy_version`` is the weight version the engine served.
    ``foreign_version``: set when the engine reported that some of its tokens came from weights of another run
    (that version; see ``toolkit.inference.versions``): never trained on.
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    policy_version: int
    latency_s: float = 0.0
    foreign_version: str | None = None


@dataclass
class TrainingSample:
    """One contiguous token sequence used for training (a trace branch).

    ``prompt_ids`` is the first prompt; ``completion_ids`` everything after it (policy tokens of every turn plus
    the environment/user tokens between turns). ``completion_mask[i]`` is True where token i was sampled by the
    policy (the loss applies there) and ``completion_logprobs[i]`` is its sampling logprob (0.0 where masked).
    All completion lists (``ref_logprobs`` too, when set) have the same length.
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    completion_mask: list[bool]
    completion_logprobs: list[float]
    ref_logprobs: list[float] | None = None
    """A reference model's logprob of each completion token (0.0 where masked), set when the sample's env trains by
    distillation (``opd``, ``opsd``): its policy tokens then feed the trainer's reference-KL term instead of the RL
    term."""
    ref_topk_ids: list[list[int]] | None = None
    """With ``algo.top_k`` = k: the reference's k most likely token ids at each completion position (k per position,
    most likely first; zeros where masked)."""
    ref_topk_logprobs: list[list[float]] | None = None
    """The reference's logprobs of ``ref_topk_ids`` (same shape)."""


@dataclass
class Rollout:
    """One episode of one task, scored. Several rollouts of the same task form a group.

    ``samples`` has more than one entry when a multi-turn trajectory had to be split because a turn's prompt did
    not extend the previous prompt + completion exactly. ``advantage`` is filled by the orchestrator.
    ``policy_version`` is the oldest policy version that produced any of its tokens. Timings are seconds.
    """

    env: str
    task_id: str
    example_id: int
    samples: list[TrainingSample] = field(default_factory=list)
    reward: float = 0.0
    reward_components: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    num_turns: int = 0
    truncated: bool = False
    truncation_reason: str | None = None  # "max_tokens" | "max_turns" | "max_total_tokens"
    error_class: str | None = None  # one of ErrorClass, None when the rollout is valid
    error_message: str | None = None
    policy_version: int = 0
    foreign_version: str | None = None  # a version of another run's weights that sampled some of its tokens
    group_id: int = -1
    advantage: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)
    seat: str | None = None
    """The agent seat whose trace this is (verifiers' ``agent.name``; trace path only): rollouts of one group
    from different seats (two players of a game) each get their own seat's advantage baseline."""

    @property
    def prompt_len(self) -> int:
        return len(self.samples[0].prompt_ids) if self.samples else 0

    @property
    def completion_len(self) -> int:
        """Policy-sampled tokens over all samples (tokens)."""
        return sum(sum(s.completion_mask) for s in self.samples)
