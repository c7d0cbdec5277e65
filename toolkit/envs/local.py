"""An in-process ``EnvSession`` over ``Episode``: the same environment half as an env worker, without a process.

For tests, offline validation of a taskset (``srl`` model-free checks) and debugging; training runs use workers
(``EnvRuntime``) so that a misbehaving task cannot stall the orchestrator.
"""

from __future__ import annotations

from typing import Any

import verifiers.v1 as vf

from toolkit.envs.episode import Episode


class LocalSession:
    """The environment half of one rollout of ``task``, run in this process."""

    def __init__(self, task: vf.Task, *, max_turns: int | None = None) -> None:
        self.episode = Episode(task, max_turns=max_turns)

    async def start(self) -> tuple[str, list[dict[str, str]]]:
        data = self.episode.task.data
        return str(data.id if data.id is not None else self.episode.task.key), await self.episode.start()

    async def step(self, reply: str) -> tuple[list[dict[str, str]], bool]:
        return await self.episode.step(reply)

    async def finish(self) -> dict[str, Any]:
        await self.episode.finalize()
        return {**await self.episode.score(), "wants_more": self.episode.wants_more}

    async def close(self) -> None:
        return None
