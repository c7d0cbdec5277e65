"""Slurm's text, read without running anything: host lists and ``scontrol show ... -o`` records. Pure helpers for
the batch job's node-side resolve (placement), the login node's checks (preflight) and the Slurm commands
(launch), which all read the same formats.
"""

from __future__ import annotations

import re

from ClusterShell.NodeSet import NodeSet


def expand_nodelist(nodelist: str) -> list[str]:
    """Expand a Slurm host list (``"node[1-3,7],gpu-a[01-02]"``) into host names, in Slurm's order.

    Uses ClusterShell's NodeSet, which implements Slurm's bracket syntax, including nested and
    multi-dimensional ranges. Empty strings and Slurm's ``(null)``/``None`` placeholders give ``[]``. Raises
    ``ClusterShell.NodeSet.NodeSetParseError`` on malformed input.
    """
    s = nodelist.strip()
    if s in ("", "(null)", "None", "N/A"):
        return []
    return list(NodeSet(s))


# A key starts a record field: letters, digits and the separators Slurm uses in keys (AllocNode:Sid,
# CPUs/Task).
_KEY_RE = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/]*)=")


def parse_scontrol_record(line: str) -> dict[str, str]:
    """Parse one ``scontrol show job -o`` line into ``{key: value}``; values keep inner ``=``
    (``TRES=cpu=1,...``).

    A value containing a space followed by ``word=`` would be split there; Slurm prints such free text only in
    Comment/Command fields, which srl does not read.
    """
    matches = list(_KEY_RE.finditer(line))
    out: dict[str, str] = {}
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        out[m.group(1)] = line[m.end() : end].strip()
    return out
