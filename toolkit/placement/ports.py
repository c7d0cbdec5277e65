"""Port allocation per job: a block of the site's range chosen from the job id, distinct offsets per host.

Why a block per job id: two jobs on one shared node must not collide, and a leftover process of a
previous job must not hold our port. Consecutive Slurm job ids get consecutive blocks, so neighbouring jobs never
share one; blocks wrap around the range after ``range // block`` jobs. Inside a block every service and every engine
on a host gets its own offset (side-channel ports included, vLLM PR 24249). The site range is validated to lie
outside the kernel's ephemeral range (``toolkit.config.site``); framework defaults (29500, 8000) are never handed out.
"""

from __future__ import annotations

import errno
import socket
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..config.site import FORBIDDEN_PORTS

# Blocks are aligned to this many ports so a job's ports are easy to read off (base + small offsets).
_ALIGN = 16


class PortError(ValueError):
    """The site's port range cannot hold this job's ports; the message gives both numbers."""


def job_key(job_id: str | int) -> int:
    """Integer used to pick the block: the numeric Slurm job id itself, else CRC32 of the string ("local")."""
    s = str(job_id)
    head = s.split("_", 1)[0].split("+", 1)[0]
    # isascii: str.isdigit() is true for other Unicode digits ("²"), which int() refuses.
    return int(head) if head.isascii() and head.isdigit() else zlib.crc32(s.encode())


@dataclass
class PortAllocator:
    """Collects (host, service, count) requests, then assigns ports once the block size is known.

    ``host`` is any hashable host key (node index; one constant when all nodes share a network namespace, as on
    the local test cluster). Use :meth:`request` for every service, then :meth:`assign` once.
    """

    range_start: int
    range_end: int
    _next: dict[object, int] = field(default_factory=dict)
    _offsets: dict[str, int] = field(default_factory=dict)
    base: int | None = None

    def request(self, host: object, service: str, count: int = 1) -> None:
        """Reserve ``count`` consecutive ports for ``service`` (a unique name) on ``host``."""
        if service in self._offsets:
            raise PortError(f"port service {service!r} requested twice")
        off = self._next.get(host, 0)
        self._offsets[service] = off
        self._next[host] = off + count

    @property
    def block_size(self) -> int:
        need = max(self._next.values(), default=1)
        return -(-need // _ALIGN) * _ALIGN

    def assign(self, job_id: str | int) -> dict[str, int]:
        """Choose this job's block and return ``{service: first port}``.

        Raises PortError when the range is smaller than one block.
        """
        size = self.block_size
        nblocks = (self.range_end - self.range_start) // size
        if nblocks < 1:
            raise PortError(
                f"the job needs {size} ports on one host but the site's port range "
                f"[{self.range_start}, {self.range_end}) holds {self.range_end - self.range_start}"
            )
        idx = job_key(job_id) % nblocks
        for _ in range(nblocks):
            base = self.range_start + idx * size
            if not any(base <= p < base + size for p in FORBIDDEN_PORTS):
                break
            idx = (idx + 1) % nblocks
        else:
            raise PortError("every block of the site's port range contains a framework default port")
        self.base = base
        return {name: base + off for name, off in self._offsets.items()}


def ports_free(ports: Iterable[int], host: str) -> bool:
    """True when every port in ``ports`` can be bound on ``host`` (an address of this machine) right now.

    Only meaningful where the ports will be bound on this machine: a local run, or a job whose nodes all share this
    machine's address (the local Slurm test cluster). Only "address in use" counts as busy: an address this
    machine cannot bind (a name that resolves elsewhere) cannot be probed here, and gives True. Nothing stays bound
    after the call.
    """
    for port in sorted(set(ports)):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError as e:
                return e.errno != errno.EADDRINUSE
    return True
