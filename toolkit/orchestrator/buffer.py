"""Assembling one trainer step's batch from finished groups.

Groups are offered in the order they finish. For each group the builder:

1. sets errored rollouts aside (never trained on; counted per env);
2. drops the whole group when an engine reported that any of its tokens came from another run's weights
   (``foreign_policy``: never trained on, and its rewards would skew the group's baseline);
3. drops the whole group when its policy is older than the off-policy bound (``off_policy``);
4. computes advantages over the group's valid rollouts, per seat when traces of several agent seats share it
   (see :mod:`toolkit.orchestrator.advantages`); a distilling env's group (``opd``) gets none: its signal is the
   teacher's logprobs on its samples, and every such group carries signal;
5. drops groups without signal when difficulty filtering is on (see :mod:`toolkit.orchestrator.filtering`; never a
   distilling group: its rewards are not its training signal);
6. adds the group to the batch.

The batch holds ``batch_size`` rollouts. Groups are whole except possibly the last: when a group does not fit
(errored rollouts make groups uneven), it is cut to the rollouts still needed, keeping the advantages computed over
the whole group and the group's launch order (never completion order, which would favour short completions).
Every offered rollout, kept or not, is recorded for the store with its off-policy age.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from toolkit.config.model import DISTILLATION
from toolkit.orchestrator.advantages import group_advantages, penalized_rewards
from toolkit.orchestrator.filtering import drop_reason, is_uniform
from toolkit.orchestrator.policy import rollout_age
from toolkit.run.types import Rollout, TrainingSample


@dataclass
class BufferSettings:
    """What shapes a batch. ``batch_size`` in rollouts; ``max_off_policy_steps`` in policy versions (None = no
    bound: the negative control without weight updates); ``algo`` and ``length_penalty`` per the run's ``algo``
    config, ``env_algos`` an env's own ``(algo, length_penalty)`` where it sets one."""

    batch_size: int
    algo: str = "grpo"
    length_penalty: float = 0.0
    filtering: bool = False
    easy_threshold: float | None = None
    hard_threshold: float | None = None
    max_off_policy_steps: int | None = 1
    env_algos: dict[str, tuple[str, float]] = field(default_factory=dict)

    def algo_of(self, env: str) -> tuple[str, float]:
        """``(algo type, length penalty)`` that trains ``env``'s rollouts."""
        return self.env_algos.get(env, (self.algo, self.length_penalty))


@dataclass
class StepBatch:
    """The batch of one trainer step being filled. See the module docstring for what :meth:`offer` does."""

    step: int
    settings: BufferSettings
    rollouts: list[Rollout] = field(default_factory=list)
    """Rollouts in the batch, with ``advantage`` set."""
    recorded: list[Rollout] = field(default_factory=list)
    """Every offered rollout (for the store), in offer order."""
    group_rewards: list[list[float]] = field(default_factory=list)
    """Valid rewards of every fresh (not stale) group offered: the basis of reward and solve-rate metrics."""
    scored: list[Rollout] = field(default_factory=list)
    """Valid rollouts of every fresh group offered (kept or filtered): per-env reward and truncation metrics."""
    dropped_groups: Counter = field(default_factory=Counter)
    dropped_rollouts: Counter = field(default_factory=Counter)
    errored: Counter = field(default_factory=Counter)
    """Errored rollouts per env."""
    error_classes: Counter = field(default_factory=Counter)
    groups_offered: int = 0
    groups_kept: int = 0
    signal_groups: int = 0
    """Kept groups whose rewards differ (non-zero advantages)."""
    trimmed_rollouts: int = 0
    foreign_versions: list[str] = field(default_factory=list)
    """The foreign weight version that made each ``foreign_policy`` group be dropped (for the log line)."""

    @property
    def remaining(self) -> int:
        """Rollouts still needed to fill the batch."""
        return max(0, self.settings.batch_size - len(self.rollouts))

    @property
    def full(self) -> bool:
        return self.remaining == 0

    def offer(self, group: list[Rollout], *, max_completion_tokens: int | None = None) -> str | None:
        """Consider one finished group; returns the drop reason or None when (part of) it joined the batch.

        ``max_completion_tokens`` (per turn, of the group's env) normalises the length penalty. A group offered to
        a full batch is recorded and dropped as ``overflow``.
        """
        s = self.settings
        self.groups_offered += 1
        self.recorded.extend(group)
        valid = [r for r in group if r.error_class is None]
        for r in group:
            if r.error_class is not None:
                self.errored[r.env] += 1
                self.error_classes[r.error_class] += 1
        foreign = next((r.foreign_version for r in group if r.foreign_version is not None), None)
        if foreign is not None:
            self.foreign_versions.append(foreign)
            return self._drop("foreign_policy", valid)
        # The group's age is its oldest sampled tokens' (rollout_age); a rollout without any has none to age
        if (
            s.max_off_policy_steps is not None
            and max((rollout_age(self.step, r) for r in valid), default=0) > s.max_off_policy_steps
        ):
            return self._drop("off_policy", valid)
        rewards = [r.reward for r in valid]
        algo, length_penalty = s.algo_of(group[0].env) if group else (s.algo, s.length_penalty)
        distils = algo in DISTILLATION  # the reference's logprobs on the samples are the signal, not rewards
        if valid:
            self.group_rewards.append(rewards)
            self.scored.extend(valid)
        if valid and not distils:
            penalized = penalized_rewards(
                rewards,
                [r.completion_len for r in valid],
                length_penalty=length_penalty,
                max_completion_tokens=max_completion_tokens,
            )
            # One baseline per seat: in a game the seats' rewards answer each other (one player's win is the
            # other's loss), so a shared mean would measure a seat against its opponent instead of against the
            # same seat's other episodes of the task.
            by_seat: dict[str | None, list[int]] = {}
            for i, r in enumerate(valid):
                by_seat.setdefault(r.seat, []).append(i)
            for idx in by_seat.values():
                for i, a in zip(idx, group_advantages([penalized[i] for i in idx], algo), strict=True):
                    valid[i].advantage = a
        reason = drop_reason(
            rewards,
            enabled=s.filtering and not distils,
            easy_threshold=s.easy_threshold,
            hard_threshold=s.hard_threshold,
        )
        if reason is not None:
            return self._drop(reason, valid)
        if self.full:
            return self._drop("overflow", valid)
        take = valid[: self.remaining]
        self.trimmed_rollouts += len(valid) - len(take)
        self.rollouts.extend(take)
        self.groups_kept += 1
        if distils or not is_uniform(rewards):
            self.signal_groups += 1
        return None

    def _drop(self, reason: str, valid: list[Rollout]) -> str:
        self.dropped_groups[reason] += 1
        self.dropped_rollouts[reason] += len(valid)
        return reason

    # -- outputs ------------------------------------------------------------------------------------
    def ages(self) -> list[int]:
        """Off-policy age (versions) of each of the batch's rollouts at this step."""
        return [rollout_age(self.step, r) for r in self.rollouts]

    def training_samples(self) -> tuple[list[TrainingSample], list[float], list[int], list[str]]:
        """``(samples, advantages, policy_versions, envs)``, one entry per training sample (a split multi-turn
        rollout contributes several samples, each with the rollout's advantage). Samples without tokens are
        skipped."""
        samples, advantages, versions, envs = [], [], [], []
        for r in self.rollouts:
            for smp in r.samples:
                if not smp.prompt_ids and not smp.completion_ids:
                    continue
                samples.append(smp)
                advantages.append(float(r.advantage))
                versions.append(int(r.policy_version))
                envs.append(r.env)
        return samples, advantages, versions, envs
