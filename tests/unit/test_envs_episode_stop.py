"""``@vf.stop`` predicates end an episode, each bound to its own task (they are looked up once per task)."""

from __future__ import annotations

import asyncio
import gc

import verifiers.v1 as vf

from toolkit.envs import episode as ep


class CountData(vf.TaskData):
    limit: int


class CountTask(vf.Task[CountData, vf.State, vf.TaskConfig]):
    async def user_turn(self, trace: vf.Trace) -> str | None:
        return "again"  # never ends by itself: only the stop predicate does

    @vf.stop
    def enough(self, trace: vf.Trace) -> bool:
        return len(trace.assistant_messages) >= self.data.limit

    @vf.reward
    async def turns(self, task: CountData, trace: vf.Trace) -> float:
        return float(len(trace.assistant_messages))


def _turns_until_done(task: CountTask) -> int:
    async def run() -> int:
        episode = ep.Episode(task)
        await episode.start()
        for turn in range(1, 10):
            _, done = await episode.step(f"reply {turn}")
            if done:
                return turn
        return -1

    return asyncio.run(run())


def test_stop_predicate_of_each_task_uses_that_task():
    two, four = CountTask(CountData(id="a", prompt="go", limit=2)), CountTask(CountData(id="b", prompt="go", limit=4))
    for _ in range(2):  # the second round uses the hooks looked up in the first
        assert _turns_until_done(two) == 2
        assert _turns_until_done(four) == 4


def test_looked_up_hooks_do_not_keep_a_task_alive():
    task = CountTask(CountData(id="c", prompt="go", limit=1))
    assert _turns_until_done(task) == 1
    assert task in ep._STOP_HOOKS
    del task
    gc.collect()
    assert not any(t.data.id == "c" for t in list(ep._STOP_HOOKS))
