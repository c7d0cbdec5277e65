"""Process helpers shared by the roles (no torch, no vllm: the orchestrator and login-node code import this)."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent() -> bool:
    """Ask the kernel to SIGKILL this process when its parent dies (prctl(2) ``PR_SET_PDEATHSIG``).

    For helper processes whose parent owns their lifetime (torchrun workers, the orchestrator's record writer):
    killed with the parent, they must not live on as orphans that keep writing into a run directory that a
    requeued job now owns. Returns whether the request took effect (Linux only); exits at once if the parent is
    already gone (this process was re-parented before the request).
    """
    if not sys.platform.startswith("linux"):
        return False
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        return False
    if os.getppid() != parent or parent == 1:  # the parent died before the request took effect
        os._exit(1)
    return True
