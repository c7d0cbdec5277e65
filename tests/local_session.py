"""An in-process ``EnvSession`` over ``Episode`` for tests: the environment half of an env worker
(``toolkit.envs.server``) without its process or stage timeouts, so a rollout loop can be driven in one process."""

from __future__ import annotations

from typing import Any

import verifiers.v1 as vf

from toolkit.envs.episode import Episode
from toolkit.envs.fidelity import task_identity


class LocalSession:
    """The environment half of one rollout of ``task``, run in this process. ``runtime_config``: verifiers' runtime
    config (default subprocess), as an env worker builds it from ``harness.runtime``."""

    def __init__(self, task: vf.Task, *, max_turns: int | None = None, runtime_config: Any = None) -> None:
        self.episode = Episode(task, max_turns=max_turns, runtime_config=runtime_config)

    async def start(self) -> tuple[str, list[dict[str, str]]]:
        try:
            return task_identity(self.episode.task), await self.episode.start()
        except BaseException:
            await self.episode.close()
            raise

    async def step(self, reply: str) -> tuple[list[dict[str, str]], bool]:
        return await self.episode.step(reply)

    async def finish(self) -> dict[str, Any]:
        try:
            await self.episode.finalize()
            return {**await self.episode.score(), "wants_more": self.episode.wants_more}
        finally:
            await self.episode.close()

    async def close(self) -> None:
        await self.episode.close()
