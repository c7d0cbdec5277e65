"""Gate verdicts: one PASS/FAIL/WARN/SKIP line per gate item and env, with its evidence, as JSON and Markdown.

The first-run gate requires, before any RL: correct
prompt/tool/user traces; intended reward on known successes and failures; mixed reward on the target base model;
bounded turn/token/time/resource use; low infrastructure error and truncation rates; a working env-server path.
Each requirement is one or more :class:`GateItem` keys (``ITEM_TITLES``). A verdict fails when any item fails;
WARN marks something worth reading that does not block training, SKIP an item that could not be measured.

Files: ``<run>/reports/eval_validate.{json,md}`` (``srl eval validate``) and ``<run>/reports/eval_gate.{json,md}``
(``srl eval run``), written by the eval gate (``toolkit.evalgate``); reports read them back with
:func:`read_verdicts` as pre-training validation evidence. Light: standard library only (login-node safe).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from toolkit.fsutil import atomic_write_json, atomic_write_text
from toolkit.run.layout import RunDir

Status = Literal["PASS", "FAIL", "WARN", "SKIP"]

ITEM_TITLES: dict[str, str] = {
    # model-free (srl eval validate)
    "taskset_loads": "taskset loads",
    "known_successes": "intended reward on known successes (Task.validate, reference answers)",
    "known_failures": "intended reward on known failures (untouched, empty, wrong, malformed)",
    "deterministic_scoring": "scoring is deterministic",
    "bounded_limits": "turn/token/time limits are bounded",
    # live endpoint (srl eval run)
    "env_server": "env-server path works",
    "traces_recorded": "correct traces recorded (prompt and turns)",
    "mixed_reward": "mixed reward at baseline",
    "bounded_use": "bounded turns/tokens/time in practice",
    "error_rate": "infrastructure error rate under threshold",
    "truncation_rate": "truncation rate under threshold",
}

VALIDATE_STEM = "eval_validate"
GATE_STEM = "eval_gate"
GATE_STEMS = {"validate": VALIDATE_STEM, "run": GATE_STEM}
"""The verdict file stem of each gate command (``srl eval validate`` / ``srl eval run``)."""
GATE_ATTEMPT = "gate_attempt"
"""The ``settings`` key of a verdict written by a Slurm gate job: that job's attempt number in its gate directory
(absent for a gate run in the login node's process)."""
GATE_REPORT_FILES = frozenset(f"{stem}.{ext}" for stem in GATE_STEMS.values() for ext in ("json", "md"))
"""The verdict files a first-run gate writes into a run's ``reports/``."""


@dataclass
class GateItem:
    """One gate check of one env. ``key`` is an ``ITEM_TITLES`` key; ``evidence`` is JSON-able (counts, rates in
    [0, 1], seconds, tokens, examples); ``detail`` says in one sentence why it passed or failed and, on failure,
    what to fix."""

    key: str
    env: str
    status: Status
    detail: str
    evidence: dict[str, Any] = field(default_factory=dict)

    @property
    def title(self) -> str:
        return ITEM_TITLES.get(self.key, self.key)


@dataclass
class Verdict:
    """All gate items of one ``srl eval validate`` or ``srl eval run``; ``passed`` is False when any item FAILs.

    ``command`` is "validate" or "run"; ``settings`` records what was checked (envs, n, r, model, endpoint, the
    thresholds); ``created`` is unix seconds.
    """

    command: str
    items: list[GateItem] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    created: float = field(default_factory=time.time)

    @property
    def passed(self) -> bool:
        return not any(i.status == "FAIL" for i in self.items)

    def failed(self) -> list[GateItem]:
        return [i for i in self.items if i.status == "FAIL"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "command": self.command,
            "passed": self.passed,
            "created": self.created,
            "settings": self.settings,
            "items": [{**asdict(i), "title": i.title} for i in self.items],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Verdict:
        items = [GateItem(i["key"], i["env"], i["status"], i["detail"], i.get("evidence", {})) for i in data["items"]]
        return cls(data["command"], items, data.get("settings", {}), data.get("created", 0.0))

    def to_markdown(self) -> str:
        """A Markdown twin of the JSON: a status line, the settings and one table row per item."""
        head = "PASSED" if self.passed else f"FAILED ({len(self.failed())} item(s))"
        lines = [f"# First-run gate: `srl eval {self.command}` {head}", ""]
        for k, v in self.settings.items():
            lines.append(f"- **{k}**: `{json.dumps(v, default=str)}`")
        lines += ["", "| env | item | status | detail | evidence |", "|---|---|---|---|---|"]
        for i in self.items:
            ev = _md_code(json.dumps(i.evidence, default=str, sort_keys=True))
            lines.append(f"| {_md_cell(i.env)} | {i.title} | **{i.status}** | {_md_cell(i.detail)} | {ev} |")
        return "\n".join(lines) + "\n"

    def write(self, reports_dir: Path, stem: str) -> tuple[Path, Path]:
        """Write ``<reports_dir>/<stem>.json`` and ``.md`` atomically; returns both paths. Raises OSError."""
        reports_dir = Path(reports_dir)
        reports_dir.mkdir(parents=True, exist_ok=True)
        js, md = reports_dir / f"{stem}.json", reports_dir / f"{stem}.md"
        atomic_write_json(js, self.to_dict())
        atomic_write_text(md, self.to_markdown())
        return js, md


def _md_cell(text: str) -> str:
    """``text`` as one Markdown table cell: HTML-escaped, ``|`` escaped, line breaks as ``<br>`` (a raw newline
    would end the row and scatter a multi-line error over the table)."""
    import html

    lines = html.escape(str(text), quote=False).replace("|", "\\|").splitlines()
    return "<br>".join(line.strip() for line in lines) or " "


def _md_code(text: str) -> str:
    """``text`` as inline code inside a table cell: on one line, ``|`` escaped, fenced by more backticks than the
    longest run of backticks in it."""
    one_line = " ".join(str(text).splitlines()).replace("|", "\\|")
    fence = "`" * (max((len(r) for r in re.findall(r"`+", one_line)), default=0) + 1)
    pad = " " if one_line.startswith("`") or one_line.endswith("`") else ""
    return f"{fence}{pad}{one_line}{pad}{fence}"


def read_verdict(run: RunDir, stem: str, *, newer_than: float = 0.0) -> Verdict | None:
    """The verdict ``<run>/reports/<stem>.json`` if it exists and was created after ``newer_than`` (unix s), else
    None (also when the file is unreadable)."""
    path = run.reports / f"{stem}.json"
    try:
        v = Verdict.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return v if v.created >= newer_than else None


def read_verdicts(run: RunDir) -> dict[str, Verdict]:
    """The gate verdicts recorded in a run's ``reports/`` directory: ``{"validate": V, "run": V}`` for the files
    present (a missing or unreadable file is left out, never an error: reports must not die on it)."""
    found = {command: read_verdict(run, stem) for command, stem in GATE_STEMS.items()}
    return {name: v for name, v in found.items() if v is not None}
