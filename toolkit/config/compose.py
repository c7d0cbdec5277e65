"""Compose a config from TOML files and command-line overrides.

``srl rl @ a.toml @ b.toml --orchestrator.batch-size 64 --no-orchestrator.buffer.online-difficulty-filtering``:
files merge left to right (tables deep-merge, lists replace), then dotted kebab-case overrides win. An override
value is read as a TOML value when it parses as one (``64``, ``1e-5``, ``true``, ``[1, 2]``, ``"x"``), else as a
plain string; the string ``None`` sets null.

A list of tables (``[[orchestrator.train.env]]``) is replaced whole by a later ``[[...]]`` of the same name, which
loses every entry the later file does not repeat; composing a file that does so prints a note naming the list and
the file. To change one entry instead, a later layer gives a *table* keyed by the entry's name
(``[orchestrator.train.env.reverse-text]`` with ``timeout = { rollout = 120 }``, or on the command line
``--orchestrator.train.env.reverse-text.timeout.rollout 120``): it deep-merges into that entry and keeps the rest.
An entry's name is its ``name``, else its ``taskset.id`` (the env-name default).
"""

from __future__ import annotations

import copy
import datetime
import tomllib
from pathlib import Path
from typing import Any

from .errors import ConfigError, ConfigIssue


def read_toml(path: Path) -> dict[str, Any]:
    """Parse one TOML file. Raises ConfigError naming the file (and TOML's line/column) on any problem."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")  # -sig: a byte-order mark (Windows editors) is no TOML error
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}", source=str(path)) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read config file {path}: {e}", source=str(path)) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError([ConfigIssue("", f"broken TOML: {e}", str(path))]) from None


def deep_merge(
    base: dict[str, Any], top: dict[str, Any], *, source: str | None = None, _prefix: str = ""
) -> dict[str, Any]:
    """Merge ``top`` over ``base``: tables merge recursively, a table over a list of tables amends the entries it
    names (:func:`amend_by_name`), everything else (lists included) is replaced. ``source`` (the layer's file)
    only names it in errors. Raises ConfigError for a table naming an entry the list does not have."""
    out = copy.deepcopy(base)
    for key, value in top.items():
        path = f"{_prefix}.{key}" if _prefix else str(key)
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value, source=source, _prefix=path)
        elif isinstance(value, dict) and _is_table_list(out.get(key)):
            out[key] = amend_by_name(out[key], value, path=path, source=source)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _is_table_list(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def entry_name(entry: dict[str, Any]) -> str | None:
    """The name an entry of a list of tables is amended by: its ``name``, else its ``taskset.id`` (an env's name
    defaults to its taskset id); None when it has neither."""
    if isinstance(entry.get("name"), str):
        return entry["name"]
    taskset = entry.get("taskset")
    return taskset["id"] if isinstance(taskset, dict) and isinstance(taskset.get("id"), str) else None


def _entry_index(items: list[dict[str, Any]], key: str, *, path: str, source: str | None) -> int:
    """Index of the entry of ``items`` named ``key``. A command-line key has its dashes turned into underscores
    (``reverse-text`` arrives as ``reverse_text``), so a name matches with either spelling when only one entry
    does. Raises ConfigError naming the list, the file and the names there are."""
    names = [entry_name(e) for e in items]
    exact = [i for i, n in enumerate(names) if n == key]
    loose = [i for i, n in enumerate(names) if n is not None and n.replace("-", "_") == key.replace("-", "_")]
    found = exact or loose
    if len(found) == 1:
        return found[0]
    known = ", ".join(repr(n) for n in names if n is not None) or "none (give each entry a name)"
    why = f"several entries are named '{key}'" if found else f"no entry of {path} is named '{key}'"
    raise ConfigError(
        [
            ConfigIssue(
                f"{path}.{key}",
                f"{why}; the table [{path}.<name>] amends the entry of that name, and the names are: {known}",
                source,
            )
        ]
    )


def amend_by_name(
    items: list[dict[str, Any]], patches: dict[str, Any], *, path: str, source: str | None = None
) -> list[dict[str, Any]]:
    """``items`` (a list of tables, e.g. the envs) with each table of ``patches`` (entry name -> fields) deep-merged
    into the entry of that name; the other entries are kept as they are. Raises ConfigError when a name matches
    no entry (or several), or a patch is not a table."""
    out = copy.deepcopy(items)
    for key, patch in patches.items():
        if not isinstance(patch, dict):
            raise ConfigError(
                [
                    ConfigIssue(
                        f"{path}.{key}",
                        f"expected a table of fields for the entry named '{key}' (e.g. [{path}.{key}]), got {patch!r}",
                        source,
                    )
                ]
            )
        i = _entry_index(out, key, path=path, source=source)
        out[i] = deep_merge(out[i], patch, source=source, _prefix=f"{path}[{i}]")
    return out


def replaced_lists(before: dict[str, Any], top: dict[str, Any], prefix: str = "") -> list[tuple[str, int]]:
    """Where merging ``top`` over ``before`` replaces a non-empty list of tables by a different list: the dotted
    path of each such list and how many entries it held. Used to tell the user, since the entries the later
    layer does not repeat are lost."""
    out: list[tuple[str, int]] = []
    for key, value in top.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        old = before.get(key)
        if isinstance(value, dict) and isinstance(old, dict):
            out += replaced_lists(old, value, path)
        elif isinstance(value, list) and _is_table_list(old) and value != old:
            out.append((path, len(old)))
    return out


def dropped_amendments(before: dict[str, Any], top: dict[str, Any], prefix: str = "") -> list[str]:
    """Where merging ``top`` over ``before`` puts a list of tables in place of a table: the dotted path of each.
    No field takes both, so the table there was an earlier layer's amendment by name (``[path.<name>]``) given
    before any layer defined the list, which the list would drop without a word."""
    out: list[str] = []
    for key, value in top.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        old = before.get(key)
        if isinstance(value, dict) and isinstance(old, dict):
            out += dropped_amendments(old, value, path)
        elif isinstance(old, dict) and old and _is_table_list(value):
            out.append(path)
    return out


def record_origins(
    tree: dict[str, Any], source: str, origins: dict[str, str], prefix: str = "", before: dict[str, Any] | None = None
) -> None:
    """Note ``source`` as the origin of every leaf of ``tree`` in ``origins`` (dotted path -> source; list items
    as ``[i]``, the spelling of config error paths). Called per layer in merge order, so the last writer wins.
    ``before``: the merged config this layer goes over, which places a table amending a list's entry by name
    (:func:`amend_by_name`) at that entry's index."""
    before = before if isinstance(before, dict) else {}
    for key, value in tree.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        old = before.get(key)
        if isinstance(value, dict) and _is_table_list(old):
            for name, patch in value.items():
                if isinstance(patch, dict):
                    i = _entry_index(old, name, path=path, source=source)
                    record_origins(patch, source, origins, f"{path}[{i}]", old[i])
        elif isinstance(value, dict) and value:
            record_origins(value, source, origins, path, old)
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            for k in [k for k in origins if k == path or k.startswith(path + "[")]:
                del origins[k]  # a list replaces the earlier one whole
            for i, item in enumerate(value):
                record_origins(item, source, origins, f"{path}[{i}]")
        else:
            origins[path] = source


def origin_of(path: str, origins: dict[str, str]) -> str | None:
    """Where the value at the error path ``path`` came from: the source of that leaf, else of every leaf below it
    (joined when several), else of the closest enclosing path; None when nothing under it was set by a layer
    (a default or a missing required field)."""
    while path:
        below = [src for k, src in origins.items() if k == path or k.startswith((path + ".", path + "["))]
        if below:
            return ", ".join(dict.fromkeys(below))
        cut = max(path.rfind("."), path.rfind("["))
        path = path[:cut] if cut > 0 else ""
    return None


def parse_overrides(args: list[str]) -> dict[str, Any]:
    """Turn ``--a.b-c VALUE`` / ``--a.b=VALUE`` / ``--flag`` / ``--no-flag`` tokens into a nested dict.

    Raises ConfigError for tokens that are not overrides (e.g. a stray positional value) and for a key that picks
    a list item by index (``--orchestrator.train.env.0.name``).
    """
    out: dict[str, Any] = {}
    seen: dict[tuple[str, ...], str] = {}
    i = 0
    while i < len(args):
        tok = args[i]
        if not tok.startswith("--") or tok == "--":
            raise ConfigError(f"unexpected argument '{tok}': overrides look like --section.field VALUE")
        body = tok[2:]
        if "=" in body:
            key, raw = body.split("=", 1)
            value: Any = _parse_value(raw)
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            key, value = body, _parse_value(args[i + 1])
            i += 1  # the value's token
        elif body.startswith("no-"):
            key, value = body[3:], False
        else:
            key, value = body, True
        i += 1
        path = [p.replace("-", "_") for p in key.split(".")]
        if not all(p and (p.replace("_", "").isalnum()) for p in path):
            raise ConfigError(f"bad override key '{key}': use dotted names like orchestrator.batch-size")
        if any(p.isdigit() for p in path):
            # A number would name a table key, not a list item: the whole list would be replaced by a table.
            raise ConfigError(
                f"override key '{key}': a list item cannot be picked by its index on the command "
                "line; change the list in a TOML file composed with @ (e.g. its [[...]] table)"
            )
        _set_override(out, path, value, key, seen)
    return out


def _set_override(out: dict[str, Any], path: list[str], value: Any, key: str, seen: dict[tuple[str, ...], str]) -> None:
    """Put one override's ``value`` at ``path`` in ``out``. ``seen`` maps each path set so far to its key as typed.
    Raises ConfigError when it and an earlier override set a path and a field below it (a list, then an
    amendment of its entries by name, or the reverse): one would silently replace the other."""
    above = [seen[tuple(path[:n])] for n in range(1, len(path)) if tuple(path[:n]) in seen]
    below = [k for p, k in seen.items() if len(p) > len(path) and list(p[: len(path)]) == path]
    if above or below:
        raise ConfigError(
            f"overrides --{(above + below)[0]} and --{key} overlap: the later one would replace what the other "
            "sets; give one of them (a list and an amendment of its entries by name go in TOML files "
            "composed with @, the list first)"
        )
    seen[tuple(path)] = key
    subtable(out, *path[:-1])[path[-1]] = value


def _parse_value(raw: str) -> Any:
    if raw == "None":
        return None
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw
    # TOML reads 00:30:00 as a time of day and 2026-01-02 as a date; no config field holds one, while fields such
    # as slurm.time take that spelling as text.
    return raw if isinstance(value, (datetime.date, datetime.time)) else value


def subtable(tree: dict[str, Any], *path: str) -> dict[str, Any]:
    """The table at ``path`` below ``tree``, made (or put in place of a non-table value) where missing."""
    node = tree
    for part in path:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    return node


def merge_layers(
    files: list[Path], overrides: list[str] | None = None, *, shape: Any = None
) -> tuple[dict[str, Any], dict[str, str], list[str]]:
    """Merge TOML ``files`` left to right, then the dotted command-line ``overrides`` on top.

    ``shape`` (optional) maps each layer to the canonical shape first: ``shape(tree, source=...)`` returns
    ``(tree, notices)``. Returns ``(merged, origins, notices)``: ``origins`` maps each field path to the file (or
    "command line") that set it last; ``notices`` holds the shape's and one per list of tables that a file
    replaces whole (naming the list and the file). Raises ConfigError for an unreadable file, a malformed override,
    a table that amends a list entry by a name the list does not have, or one that amends a list only a later
    layer defines.
    """
    merged: dict[str, Any] = {}
    origins: dict[str, str] = {}
    notices: list[str] = []
    layers = [(read_toml(Path(p)), str(p)) for p in files]
    over = parse_overrides(list(overrides or []))
    if over:
        layers.append((over, "command line"))
    for tree, source in layers:
        if shape is not None:
            tree, got = shape(tree, source=source)
            notices += got
        for path in dropped_amendments(merged, tree):
            names = ", ".join(f"'{k}'" for k in subtable(merged, *path.split(".")))
            raise ConfigError(
                [
                    ConfigIssue(
                        path,
                        f"{origin_of(path, origins) or 'an earlier layer'} amends entries "
                        f"of this list by name ({names}) before any layer defines the list, and "
                        f"{source} defines it afterwards, which would drop those amendments: "
                        f"compose the amending file after {source}",
                        source,
                    )
                ]
            )
        if source != "command line":  # an override that sets a list says so itself
            for path, n in replaced_lists(merged, tree):
                notices.append(
                    f"{source} replaces the whole list {path} ({n} {'entry' if n == 1 else 'entries'} before it; "
                    f"those it does not repeat are gone). To change one entry and keep the rest, give a table "
                    f"keyed by its name instead: [{path}.<name>]"
                )
        record_origins(tree, source, origins, before=merged)
        merged = deep_merge(merged, tree, source=source)
    return merged, origins, notices
