"""The run's admin token: what lets srl (and only srl) call the engines' admin routes.

vLLM engines run with ``VLLM_SERVER_DEV_MODE=1`` because live weight reload needs ``/collective_rpc``, ``/pause``,
``/resume``, ... vllm-router forwards every path to a worker, so these routes are guarded in each engine by
``toolkit.inference.guard.AdminGuard``, which admits them only with this token in the ``X-SRL-Admin-Token``
header.

Life of a token (32 random bytes, URL-safe base64 or hex):

- it travels only in the environment variable ``SRL_ADMIN_TOKEN``: never on a command line, in a config, in
  placement.json, an sbatch script, a log or a report;
- local runs and local servers (``toolkit.launch.local``: ``run_local``, ``serve_local``) create a fresh one in
  the launcher process and their children (engines, orchestrator) inherit it;
- Slurm jobs create one in the batch script at job start (bash, from /dev/urandom) and export it; every ``srun``
  job step inherits it. A requeued RL job creates a new one: all its components restart with it;
- the one exception to "environment only": an inference-only deployment (``srl inference``, local or Slurm) also
  writes it to ``<run>/launcher/admin_token`` (mode 0600, the user's own file on the shared filesystem) and reuses
  that file across requeues, so an RL run with ``inference.external = <that run>`` can read it
  (:func:`read_token_file`).

An engine started without the variable refuses every admin route (fail closed).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from toolkit.run.layout import RunDir

ADMIN_TOKEN_ENV = "SRL_ADMIN_TOKEN"
ADMIN_TOKEN_HEADER = "X-SRL-Admin-Token"
TOKEN_BYTES = 32  # 256 bits: secrets.token_urlsafe's own recommendation for tokens


def new_admin_token() -> str:
    """A fresh random token (43 URL-safe characters from ``TOKEN_BYTES`` random bytes)."""
    return secrets.token_urlsafe(TOKEN_BYTES)


def admin_token_from_env() -> str | None:
    """``SRL_ADMIN_TOKEN`` from this process's environment, None when unset or empty."""
    return os.environ.get(ADMIN_TOKEN_ENV, "").strip() or None


def admin_headers(token: str | None) -> dict[str, str]:
    """HTTP headers carrying ``token`` to an engine's admin route; empty when ``token`` is None."""
    return {ADMIN_TOKEN_HEADER: token} if token else {}


def write_token_file(path: Path, token: str) -> None:
    """Write ``token`` to ``path`` with mode 0600 atomically (created 0600 from the start, then renamed over:
    no moment where another user could read it). Raises OSError when the directory is not writable."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # O_CREAT's mode does not apply to a file that already existed
        os.write(fd, token.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def read_token_file(path: Path) -> str | None:
    """The token in ``path``, None when the file is missing or empty."""
    try:
        return Path(path).read_text().strip() or None
    except FileNotFoundError:
        return None


def for_local_deployment(run: RunDir, *, publish: bool) -> str:
    """Token for a deployment the local launcher is about to start in ``run``.

    ``publish`` (an inference-only deployment, whose users are other runs): reuse ``run.admin_token_file`` if an
    earlier attempt wrote it, else create one and write the file. Otherwise: a fresh token, written nowhere.
    """
    if not publish:
        return new_admin_token()
    token = read_token_file(run.admin_token_file)
    if token is None:
        token = new_admin_token()
        write_token_file(run.admin_token_file, token)
    return token


def restore_admin_token(previous: str | None) -> None:
    """Put ``SRL_ADMIN_TOKEN`` in this process's environment back to ``previous`` (None: unset), after a launcher
    exported its run's token there for its children."""
    if previous is None:
        os.environ.pop(ADMIN_TOKEN_ENV, None)
    else:
        os.environ[ADMIN_TOKEN_ENV] = previous
