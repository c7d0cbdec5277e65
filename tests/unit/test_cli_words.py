"""Help texts and messages speak the user's language: no references to documents, issues or internal case numbers
that a user of srl does not have."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from config_cases import warnings_of
from golden.layouts import BASE, merge

from toolkit.config.schema_help import schema_help

# "the seed's boundaries", "field case B14", "(B18)", "issue 9 item 7", "shared/seeds/...".
FOREIGN = re.compile(
    r"\bthe seeds?\b|\bseed's|\bseeds'|field case|\bB\d\d\b|\bissue \d|shared/(seeds|notes)", re.IGNORECASE
)

COMMANDS = [
    ["--help"],
    ["rl", "--help"],
    ["sft", "--help"],
    ["sft", "chain", "--help"],
    ["diagnose", "--help"],
    ["report", "--help"],
    ["status", "--help"],
    ["cancel", "--help"],
    ["logs", "--help"],
    ["eval", "--help"],
    ["sweep", "--help"],
    ["model", "--help"],
    ["config"],
]


@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
def test_help_texts_name_nothing_the_user_does_not_have(argv):
    r = subprocess.run(
        [sys.executable, "-m", "toolkit.cli", *argv], capture_output=True, text=True, timeout=120, check=False
    )
    text = r.stdout + r.stderr
    assert text.strip(), argv
    # A verb wired to a module or function that is gone prints its own error; help must still succeed.
    assert r.returncode == (2 if argv == ["config"] else 0), (argv, r.returncode, text[-2000:])
    assert not FOREIGN.findall(text), [line for line in text.splitlines() if FOREIGN.search(line)]


def test_usage_says_what_diagnose_does():
    from toolkit.cli import USAGE

    line = next(x for x in USAGE.splitlines() if "srl diagnose" in x)
    assert "why a run failed" in line and len(line) <= 110


def test_config_warnings_say_why():
    over = {"orchestrator": {"group_size": 4, "batch_size": 8, "eval": {"env": []}}}
    text = warnings_of(merge(BASE, over))
    assert "group_size 4 is small" in text and "held-out eval env" in text, text
    assert not FOREIGN.search(text), text
    assert not FOREIGN.search(schema_help())


def _usage_verbs() -> list[list[str]]:
    """Every ``srl VERB [SUBVERB]`` that ``srl --help`` lists (a command opens a line or follows ``|``; a subverb is
    a lowercase word right after the verb)."""
    from toolkit.cli import USAGE

    found = re.findall(r"(?:^  |\| )srl ([a-z][a-z-]*)(?: ([a-z][a-z0-9-]*)\b(?![./]))?", USAGE, re.MULTILINE)
    return sorted({tuple(w for w in pair if w) for pair in found})  # type: ignore[return-value]


def test_usage_names_exactly_the_verbs_srl_dispatches():
    from toolkit.cli import _ROLE_COMMANDS

    named = {v[0] for v in _usage_verbs()}
    assert named == {"rl", "config", *_ROLE_COMMANDS}, named ^ {"rl", "config", *_ROLE_COMMANDS}


@pytest.mark.parametrize("verb", _usage_verbs(), ids=" ".join)
def test_every_verb_in_usage_answers_help_with_status_0(verb):
    r = subprocess.run(
        [sys.executable, "-m", "toolkit.cli", *verb, "--help"], capture_output=True, text=True, timeout=120, check=False
    )
    assert r.returncode == 0, (verb, r.returncode, (r.stdout + r.stderr)[-2000:])
    assert verb[-1] in r.stdout + r.stderr, verb  # its own help, not an error about something else
