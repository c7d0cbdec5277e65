"""The command line of every run-shaped command (``srl rl``, ``srl sft``, ``srl sweep``, ``srl inference``,
``srl eval``, ``srl config show``): ``@ FILE`` layers, srl's own flags, and dotted config overrides.

One splitter for all of them, so they compose alike: files merge left to right, ``--section.field VALUE``
overrides win, and ``--site NAME`` / ``--output-dir DIR`` are overrides of the config's ``site`` and
``output_dir`` like any other field.
"""

from __future__ import annotations

import difflib
from pathlib import Path

from .errors import ConfigError

OWN_FLAGS = ("--dry-run", "--resume", "--clean", "--start-soonest", "--help", "-h")


def print_help_if_asked(argv: list[str], usage: str) -> bool:
    """For a subcommand with a fixed usage (``srl sft make-data``, ``srl config show``, ...): when ``argv`` holds
    ``-h`` or ``--help``, print ``usage`` to stdout and return True (the caller exits 0) instead of reading the flag
    as a config file, an output path or a run directory."""
    if "-h" in argv or "--help" in argv:
        print(usage)
        return True
    return False


def refuse_misspelt_flag(tok: str) -> None:
    """Raise ConfigError for a near miss of srl's own flags (``--dryrun``, ``--resum``): as a config override it
    would only get a confusing "unknown config key" hint. Dotted names and ``--key=value`` are overrides."""
    if not tok.startswith("--") or "." in tok or "=" in tok:
        return
    close = difflib.get_close_matches(tok.replace("_", "-"), OWN_FLAGS[:-1], n=1, cutoff=0.8)
    if close:
        raise ConfigError(
            f"unknown option {tok}; did you mean {close[0]}? (srl's own flags: "
            f"{', '.join(OWN_FLAGS[:-1])}; config overrides look like --section.field VALUE)"
        )


def split_config_args(argv: list[str], *, start_soonest: bool = False) -> tuple[list[Path], list[str], dict[str, bool]]:
    """Split ``@ FILE`` pairs (or ``@FILE``), srl's own flags and config overrides.

    Returns ``(files, overrides, flags)`` in command-line order; flags are dry_run, resume, clean, start_soonest, help
    (``--start-soonest`` is refused unless ``start_soonest``: only ``srl rl`` picks a shape by the queue).
    ``--site X`` and ``--output-dir X`` are overrides. Raises ConfigError for a dangling ``@``, a misspelt flag, an
    override directly followed by a file (``--site @x.toml``), or a ``.toml`` file given without ``@`` (not as an
    override's value).
    """
    files: list[Path] = []
    rest: list[str] = []
    flags = {"dry_run": False, "resume": False, "clean": False, "start_soonest": False, "help": False}
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok.startswith("@") and rest and rest[-1] == argv[i - 1] and _wants_value(rest[-1]):
            # Composed as a file, the path would leave the option without a value: it would read as "true" and
            # fail later as a wrong type, while the file's keys fail as unknown keys of the run config.
            raise ConfigError(
                f"{rest[-1]} is followed by '{tok}': '@' composes a config file, leaving {rest[-1]} "
                f"without a value; give the value without '@' ({rest[-1]} VALUE), or write "
                f"{rest[-1]}=true for an on/off field"
            )
        if tok == "@":
            if i + 1 >= len(argv):
                raise ConfigError("'@' must be followed by a TOML file path")
            files.append(Path(argv[i + 1]))
            i += 2
            continue
        if tok.startswith("@") and len(tok) > 1:
            files.append(Path(tok[1:]))
        elif tok in OWN_FLAGS:
            flags[{"-h": "help", "--help": "help"}.get(tok, tok[2:].replace("-", "_"))] = True
        elif tok.endswith(".toml") and not (rest and _wants_value(rest[-1])):
            # Read as an override it would only be "unexpected argument"; without any file, the command would
            # answer with its own example file instead of this one.
            raise ConfigError(
                f"'{tok}' looks like a config file: compose it with '@' before it (@ {tok}); "
                "several compose left to right (@ job.toml @ overlay.toml)"
            )
        else:
            refuse_misspelt_flag(tok)
            rest.append(tok)
        i += 1
    if flags["start_soonest"] and not start_soonest:
        raise ConfigError("--start-soonest is an option of srl rl only (it picks the run's shape by the Slurm queue)")
    return files, rest, flags


def _wants_value(tok: str) -> bool:
    """Whether ``tok`` is an override option still waiting for its value (``--key``; not ``--key=V`` or
    ``--no-key``)."""
    return tok.startswith("--") and "=" not in tok and not tok.startswith("--no-")
