"""Slurm time-limit strings, parsed exactly as sbatch(1) documents them.

Accepted forms: ``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``, ``D-H:M:S``; ``UNLIMITED``/``INFINITE`` mean no limit.
Source: sbatch man page, option ``--time``. Note ``3-0:00`` is three days (D-H:M), while ``30:00`` is 30 minutes (M:S).
"""

from __future__ import annotations

import re

_DAYS = re.compile(r"^(\d+)-(\d+)(?::(\d+))?(?::(\d+))?$")
_CLOCK = re.compile(r"^(\d+)(?::(\d+))?(?::(\d+))?$")


def parse_slurm_time(text: str) -> int | None:
    """Return the time limit in seconds (None for unlimited). Raises ValueError naming the accepted forms."""
    s = str(text).strip()
    if s.upper() in ("UNLIMITED", "INFINITE"):
        return None
    m = _DAYS.match(s)
    if m:
        d, h, mi, se = (int(g) if g is not None else 0 for g in m.groups())
        return _checked(s, ((d * 24 + h) * 60 + mi) * 60 + se, mi, se)
    m = _CLOCK.match(s)
    if m:
        a, b, c = m.groups()
        if b is None:  # M
            return _checked(s, int(a) * 60, 0, 0)
        if c is None:  # M:S
            return _checked(s, int(a) * 60 + int(b), 0, int(b))
        return _checked(s, (int(a) * 60 + int(b)) * 60 + int(c), int(b), int(c))  # H:M:S
    raise ValueError(
        f"'{text}' is not a Slurm time limit; use one of M, M:S, H:M:S, D-H, D-H:M, D-H:M:S "
        "(e.g. 90, 04:00:00, 3-0:00) or UNLIMITED"
    )


def _checked(text: str, seconds: int, minutes: int, secs: int) -> int:
    if minutes >= 60 or secs >= 60:
        raise ValueError(f"'{text}': minutes and seconds fields must be below 60")
    if seconds <= 0:
        raise ValueError(f"'{text}': a time limit must be positive")
    return seconds
