"""Crash-safe writes on a shared parallel filesystem.

Readers on other nodes must never see a half-written file or directory. Every writer in srl therefore
writes into a temporary name in the same directory, flushes it, and renames it into place: rename is
atomic within one directory on POSIX filesystems, including NFS and Lustre. Markers (READY, STABLE,
COMPLETE) are written last, so their presence means everything they vouch for is complete.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def _tmp_name(path: Path) -> Path:
    # Leading dot + unique suffix: never matches step_<n> scans, never collides between writers.
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def atomic_write_bytes(path: Path, data: bytes, *, sync: bool = True) -> None:
    """Write ``data`` to ``path`` via a temporary file + fsync + rename. Raises OSError (e.g. ENOSPC).

    ``sync=False`` skips the fsync: readers still never see a torn file (the rename is atomic), but a crash of
    the machine may lose the write; only for records that are rewritten all the time and worthless after a crash
    (liveness records), where the fsync (~3 ms on ext4) would sit on a hot path."""
    path = Path(path)
    tmp = _tmp_name(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            if sync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def atomic_write_text(path: Path, text: str, *, sync: bool = True) -> None:
    """Atomically write UTF-8 ``text`` to ``path`` (``sync`` as for :func:`atomic_write_bytes`)."""
    atomic_write_bytes(path, text.encode("utf-8"), sync=sync)


def atomic_write_json(path: Path, obj: Any, *, sync: bool = True) -> None:
    """Atomically write ``obj`` as indented JSON (keys sorted, so files diff cleanly; ``sync`` as for
    :func:`atomic_write_bytes`)."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n", sync=sync)


def read_json(path: Path) -> Any:
    """The JSON value in ``path``; None when the file is missing or unreadable, is not UTF-8 or is not JSON (a
    reader of run files that may be damaged or half-written by hand decides what None means)."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):  # ValueError: bad JSON, or bytes that are not UTF-8
        return None


def write_marker(path: Path, *, sync: bool = True) -> None:
    """Create an empty marker file atomically (STABLE, READY, COMPLETE).

    ``sync=False`` skips the file's fsync: only for a marker inside :func:`atomic_directory`, whose directory fsync
    before the rename makes the (empty) marker durable anyway; one fsync less per batch and broadcast (~3 ms on
    ext4)."""
    if sync:
        atomic_write_bytes(path, b"")
    else:
        Path(path).touch()


@contextlib.contextmanager
def atomic_directory(final: Path) -> Iterator[Path]:
    """Yield a temporary directory next to ``final``; on success rename it to ``final``.

    On any exception the temporary directory is removed and ``final`` is left untouched. If ``final``
    already exists (a retried write of the same step) it is replaced. A SIGKILL mid-write leaves only a
    dot-prefixed temporary directory, which step scans ignore and :func:`remove_stale_temps` deletes.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_name(final)
    tmp.mkdir()
    try:
        yield tmp
        _fsync_dir(tmp)
        old = _tmp_name(final)
        if final.exists():
            os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)  # the replaced directory, if there was one
        _fsync_dir(final.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def remove_stale_temps(parent: Path) -> int:
    """Delete temporary entries left by killed writers under ``parent``; returns how many were removed."""
    parent = Path(parent)
    if not parent.is_dir():
        return 0
    n = 0
    for entry in parent.iterdir():
        if entry.name.startswith(".") and ".tmp-" in entry.name:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    entry.unlink()
            n += 1
    return n


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def append_jsonl(path: Path, obj: dict[str, Any]) -> None:
    """Append one JSON line with a single ``write`` on an O_APPEND descriptor.

    One write per line keeps lines from two processes (trainer, orchestrator) from interleaving.
    """
    line = (json.dumps(obj, sort_keys=True, default=float) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
