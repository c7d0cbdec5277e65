"""Harness programs on compute nodes without a package index: their PEP 723 scripts run with the job's interpreter.

verifiers starts a harness program (the ``null`` harness's chat program: tool-calling loop, MCP client) as a PEP
723 script that ``uv`` provisions at run time (``Runtime.prepare_uv_script``: install uv, ``uv sync --script``
against a package index). A compute node usually has no index, and the job's own interpreter already holds
verifiers and therefore every dependency its bundled programs declare (openai, mcp, httpx, tenacity, certifi).

:func:`use_job_interpreter` makes verifiers' ``subprocess`` runtime run such a script with ``sys.executable`` when
that interpreter satisfies every requirement the script declares; the program text, its arguments and its
environment stay verifiers' own, only the interpreter's provisioning differs. Each episode's program then starts
as a fork of an interpreter that imported the script's modules once (:mod:`toolkit.envs.forkserver`; about 0.1 s
instead of a second of CPU per episode); ``SRL_FORK_PROGRAMS=0`` in the job's environment (``env_vars``) starts
a fresh interpreter per episode instead. A script that needs something the
interpreter lacks keeps verifiers' uv path (and fails as verifiers would without an index: a HarnessError whose
message names uv). Container runtimes are untouched (the program runs inside the image, with its interpreter).
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
import tomllib
import uuid
import weakref
from importlib import metadata
from pathlib import Path
from typing import Any

_BLOCK = re.compile(r"(?m)^# /// script\s*$\n(?P<body>(?:^#(?: .*)?$\n)+?)^# ///\s*$")


def script_requirements(script: str | bytes) -> list[str]:
    """The ``dependencies`` of a PEP 723 script's ``# /// script`` block (``[]`` without one). Raises ValueError
    for a block that is not TOML."""
    text = script.decode() if isinstance(script, bytes) else script
    match = _BLOCK.search(text)
    if match is None:
        return []
    body = "".join(line[2:] if line.startswith("# ") else line[1:] for line in match["body"].splitlines(True))
    try:
        return [str(d) for d in tomllib.loads(body).get("dependencies", [])]
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"the script's PEP 723 block is not TOML: {exc}") from exc


def missing_requirements(requirements: list[str]) -> list[str]:
    """The requirements (PEP 508 strings) this interpreter's installed distributions do not satisfy; a marker that
    does not apply here is satisfied."""
    from packaging.requirements import Requirement

    missing = []
    for spec in requirements:
        req = Requirement(spec)
        if req.marker is not None and not req.marker.evaluate():
            continue
        try:
            version = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            missing.append(spec)
            continue
        if req.specifier and not req.specifier.contains(version, prereleases=True):
            missing.append(f"{spec} (installed: {version})")
    return missing


_FORK_SERVERS: dict[str, Any] = {}
_FORK_LOCKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""Event loop -> asyncio.Lock (a lock belongs to the loop it first waited in)."""


async def _fork_server(script: bytes) -> Any:
    """The fork server for ``script`` in this process (:mod:`toolkit.envs.forkserver`), started on first use with
    the script's imports preloaded; None when ``SRL_FORK_PROGRAMS=0`` or the server could not start (the script
    then runs as a plain process)."""
    import asyncio
    import atexit

    from toolkit.envs.forkserver import ForkServer, program_modules

    if os.environ.get("SRL_FORK_PROGRAMS", "1") == "0":
        return None
    key = hashlib.sha256(script).hexdigest()
    lock = _FORK_LOCKS.setdefault(asyncio.get_running_loop(), asyncio.Lock())
    async with lock:
        if key not in _FORK_SERVERS:
            try:
                modules = program_modules(script.decode())
            except (SyntaxError, UnicodeDecodeError):
                modules = []
            server = await asyncio.to_thread(ForkServer.start, modules)
            _FORK_SERVERS[key] = server
            if server is not None:
                atexit.register(server.close)
        return _FORK_SERVERS[key]


def use_job_interpreter() -> None:
    """Make verifiers' ``SubprocessRuntime.prepare_uv_script`` run satisfiable scripts with this interpreter (see
    the module docstring). Idempotent; call once in an env worker before any episode starts."""
    from verifiers.v1.runtimes.subprocess import SubprocessRuntime

    if getattr(SubprocessRuntime.prepare_uv_script, "_srl_job_interpreter", False):
        return
    uv_path = SubprocessRuntime.prepare_uv_script

    async def prepare_uv_script(
        self: Any, script: str | bytes, env: dict[str, str] | None = None, *, activate: bool = True
    ) -> list[str]:
        data = script.encode() if isinstance(script, str) else script
        if missing_requirements(script_requirements(data)):
            return await uv_path(self, script, env, activate=activate)
        # The same place verifiers writes it (one file per script content), so what runs is inspectable there.
        # Written once, whole (temporary file, then rename): concurrent episodes start the same program, and one
        # must never read the file half-written by another.
        path = Path(self.scripts_dir) / f"{hashlib.sha256(data).hexdigest()}.py"
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)
        server = await _fork_server(data)
        return server.command(str(path)) if server is not None else [sys.executable, str(path)]

    prepare_uv_script._srl_job_interpreter = True  # type: ignore[attr-defined]
    SubprocessRuntime.prepare_uv_script = prepare_uv_script  # type: ignore[method-assign]
