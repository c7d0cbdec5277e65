"""SIGKILL a writer at random moments, many times, without paying Python start-up per kill point.

The test process imports everything once and forks a child per kill point; the child runs a writer loop that never
ends on its own, and the parent kills it with SIGKILL after a random delay. A fork costs milliseconds where a fresh
interpreter with torch costs seconds, so a test can afford dozens of kill points. Only use writers that are safe
after ``fork`` (single-threaded; torch limited to one intra-op thread).
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Callable


def _no_progress_bars() -> None:
    """In the forked child: no tqdm progress bars. Every tqdm bar takes tqdm's write lock, which holds a
    multiprocessing semaphore created in the parent and shared through the fork; a child SIGKILLed while holding it
    leaves it taken, and the parent's next bar (transformers' "Loading weights") waits forever. That deadlocked
    test_trainer_crash once. transformers then hands out bars that take no lock."""
    import sys

    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()


def kill_at_random(writer: Callable[[], None], *, rng: random.Random, max_delay_s: float) -> None:
    """Fork, run ``writer()`` in the child, SIGKILL the child after ``uniform(0, max_delay_s)`` seconds.

    The delay is measured from the moment the child is running (it reports through a pipe before calling
    ``writer``). Raises AssertionError when the child ended by itself (the writer failed: its traceback is on
    stderr) instead of being killed, because then the kill point proved nothing.
    """
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never return into the test runner
        code = 1
        try:
            os.close(r)
            _no_progress_bars()
            os.write(w, b"!")
            os.close(w)
            writer()
        except BaseException:  # noqa: BLE001 - report and exit; the parent sees the non-kill status
            import traceback

            traceback.print_exc()
        finally:
            os._exit(code)
    os.close(w)
    try:
        assert os.read(r, 1) == b"!", "writer child did not start"
    finally:
        os.close(r)
    time.sleep(rng.uniform(0.0, max_delay_s))
    try:
        os.kill(pid, signal.SIGKILL)
    finally:
        _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (
        f"writer child exited by itself (status {status:#x}) before the kill: see its traceback above"
    )
