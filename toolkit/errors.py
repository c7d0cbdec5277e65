"""Error classes of srl, one per failure boundary (see ``toolkit.run.types.ErrorClass``).

Every rollout failure is tagged with exactly one class. Transient classes (provider, sandbox, tunnel) are retried
with backoff; deterministic ones (harness, toolset, user simulator, task) are not, because a retry cannot fix them.
Each exception carries its class name in ``error_class`` so a caller can record it without ``isinstance`` chains.
"""

from __future__ import annotations


class SrlRolloutError(Exception):
    """Base class of every error that can end one rollout. ``error_class`` names its taxonomy class: the subclass
    of this class that it is or derives from (set from that class's name)."""

    error_class: str = "SrlRolloutError"

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if SrlRolloutError in cls.__bases__:
            cls.error_class = cls.__name__


class ProviderError(SrlRolloutError):
    """The inference endpoint failed: unreachable engine or router, HTTP 5xx, timeout, model or request dialect."""


class HarnessError(SrlRolloutError):
    """The harness program failed to install, launch, or exited non-zero."""


class ToolsetError(SrlRolloutError):
    """A tool server failed to start, was unreachable, or misbehaved on a call."""


class UserError(SrlRolloutError):
    """The simulated-user server failed."""


class SandboxError(SrlRolloutError):
    """The runtime failed: capacity, lifecycle, filesystem or network of the sandbox."""


class TunnelError(SrlRolloutError):
    """The interception tunnel between harness and policy failed."""


class TaskError(SrlRolloutError):
    """Task setup, finalize or scoring code failed."""


class RewardSkippedError(SrlRolloutError):
    """Scoring finished but left a reward or metric unscored (verifiers skips a signal that needs a runtime when
    none is given): the reward would read as a silent 0, so the rollout is an error instead."""
