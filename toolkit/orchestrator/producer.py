"""Keeping groups in flight: the producer half of the orchestrator's pipeline.

The step loop asks for groups (:meth:`GroupProducer.want`); the producer draws ``(env, example)`` from the
sampler, waits for ``group_size`` free rollout slots (``max_concurrent`` in all), runs the group through the env's
``EnvRuntime`` and puts the finished group on a queue. Groups launched for one step and not needed by it (over-
sampling, errors) stay queued for the next step, which drops them only if they are too old for its policy bound.
Draws happen in launch order on one task, so the sequence of (env, example) pairs depends only on the seed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from toolkit.orchestrator.sampler import EnvSampler
from toolkit.run.types import Rollout, SamplingParams

if TYPE_CHECKING:
    from toolkit.config.model import RLConfig


log = logging.getLogger(__name__)


class Slots:
    """A counting limiter whose acquisitions take several slots at once (a group takes one per rollout).

    Taking all of a group's slots atomically avoids the deadlock of acquiring them one by one, where two groups
    each hold part of the capacity. A request larger than ``capacity`` takes the whole capacity.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, int(capacity))
        self.used = 0
        self._cond = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def hold(self, n: int) -> AsyncIterator[None]:
        n = max(1, min(int(n), self.capacity))
        async with self._cond:
            await self._cond.wait_for(lambda: self.used + n <= self.capacity)
            self.used += n
        try:
            yield
        finally:
            async with self._cond:
                self.used -= n
                self._cond.notify_all()


@dataclass
class TrainEnv:
    """A started training env: its runtime, group size, sampling (``max_tokens`` per turn) and, for a distilling env
    (``opd``), the teacher that scores its groups (a ``teacher.TeacherScorer``)."""

    name: str
    runtime: Any
    group_size: int
    sampling: SamplingParams
    teacher: Any = None


class GroupProducer:
    """Launches groups on demand; finished groups (``list[Rollout]``, ``group_id`` set) arrive on :attr:`queue`.

    ``max_concurrent`` bounds rollouts in flight. A group whose runtime raises (not an ``SrlRolloutError``: those
    come back as errored rollouts) is returned as ``group_size`` errored rollouts of class SandboxError, so one
    broken env cannot kill the orchestrator; the exception is logged. A distilling env's group is scored by its
    teacher before it is queued; a teacher that fails is fatal: the error is kept in :attr:`failure` (the step loop
    raises it) and the group is not queued.
    """

    def __init__(
        self,
        envs: dict[str, TrainEnv],
        sampler: EnvSampler,
        client: Any,
        *,
        max_concurrent: int,
        next_group_id: int = 0,
    ) -> None:
        self.envs = envs
        self.sampler = sampler
        self.client = client
        self.slots = Slots(max_concurrent)
        self.queue: asyncio.Queue[list[Rollout]] = asyncio.Queue()
        self.wanted = 0
        self.inflight = 0  # groups launched and not yet queued
        self.next_group_id = next_group_id
        self._seed_counter = 0
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        self.failure: Exception | None = None

    def want(self, groups: int) -> None:
        """Make sure ``groups`` groups are in flight or queued (launch the difference; never cancels)."""
        self.wanted = max(0, groups - self.inflight - self.queue.qsize())
        self._wake.set()

    def pause(self) -> None:
        """Launch nothing more until the next :meth:`want`."""
        self.wanted = 0

    async def run(self) -> None:
        """Launch loop; runs until cancelled (then cancels the groups in flight)."""
        try:
            while True:
                if self.wanted <= 0:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                env_name, example = self.sampler.draw()
                env = self.envs[env_name]
                group_id = self.next_group_id
                self.next_group_id += 1
                self.wanted -= 1
                self.inflight += 1
                started = asyncio.Event()
                task = asyncio.create_task(self._run_group(env, example, group_id, started))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
                await started.wait()  # its slots are taken: the next draw waits for capacity in order
        finally:
            for t in list(self._tasks):
                t.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _sampling(self, env: TrainEnv) -> list[SamplingParams] | None:
        # A configured sampling seed must differ per rollout, or a group would hold identical completions.
        if env.sampling.seed is None:
            return None
        out = []
        for _ in range(env.group_size):
            out.append(dataclasses.replace(env.sampling, seed=env.sampling.seed + self._seed_counter))
            self._seed_counter += 1
        return out

    async def _run_group(self, env: TrainEnv, example: int, group_id: int, started: asyncio.Event) -> None:
        try:
            async with self.slots.hold(env.group_size):
                started.set()
                per_rollout = self._sampling(env)
                try:
                    if per_rollout is None:
                        group = await env.runtime.run_group(
                            example, env.group_size, client=self.client, sampling=env.sampling
                        )
                    else:
                        episodes = await asyncio.gather(
                            *(env.runtime.run_episode(example, client=self.client, sampling=s) for s in per_rollout)
                        )
                        group = [r for rollouts in episodes for r in rollouts]
                except Exception as exc:
                    log.exception("env %s failed to run a group of example %d", env.name, example)
                    group = [
                        Rollout(
                            env=env.name,
                            task_id=str(example),
                            example_id=example,
                            error_class="SandboxError",
                            error_message=f"{type(exc).__name__}: {exc}",
                        )
                        for _ in range(env.group_size)
                    ]
            for r in group:
                r.group_id = group_id
            if env.teacher is not None:
                try:
                    await env.teacher.score_group(group)
                except Exception as exc:  # noqa: BLE001 - kept for the step loop, which ends the run with it
                    self.failure = self.failure or exc
                    return
            self.queue.put_nowait(group)
        finally:
            started.set()
            self.inflight -= 1


def sampling_params(base: Any, override: Any | None = None) -> SamplingParams:
    """``SamplingParams`` from a ``SamplingConfig`` and an optional per-env ``SamplingOverride`` (unset override
    fields inherit ``base``). ``max_completion_tokens`` becomes ``max_tokens`` (per turn, tokens)."""
    fields = {k: getattr(base, k) for k in ("temperature", "top_p", "top_k", "max_completion_tokens", "seed")}
    if override is not None:
        fields.update({k: v for k, v in override.model_dump().items() if v is not None})
    return SamplingParams(
        temperature=float(fields["temperature"]),
        top_p=float(fields["top_p"]),
        top_k=fields["top_k"],
        max_tokens=int(fields["max_completion_tokens"]),
        seed=fields["seed"],
    )


def env_list(cfg: RLConfig, names: Sequence[str] | None = None) -> list[tuple[Any, str]]:
    """``[(env_cfg with its name filled, "train" | "eval"), ...]`` of a run config, optionally only ``names``.

    Raises ValueError naming the available envs when a requested name does not exist.
    """
    o = cfg.orchestrator
    envs = [(e.model_copy(update={"name": e.env_name}), "train") for e in o.train.env]
    envs += [(e.model_copy(update={"name": e.env_name}), "eval") for e in o.eval.env]
    if names:
        known = [e.name for e, _ in envs]
        missing = [n for n in names if n not in known]
        if missing:
            raise ValueError(f"no env named {missing}; the config has {known}")
        envs = [(e, kind) for e, kind in envs if e.name in names]
    return envs


def env_sampling(cfg: RLConfig, env: Any, kind: str) -> SamplingParams:
    """The sampling of one env of ``env_list``: its override over the train sampling (an eval env: over the eval
    sampling, the train one when that is unset)."""
    o = cfg.orchestrator
    base = (o.eval.sampling or o.train.sampling) if kind == "eval" else o.train.sampling
    return sampling_params(base, env.sampling)
