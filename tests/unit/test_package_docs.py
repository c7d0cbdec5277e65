"""Every package's ``__init__.py`` docstring maps its modules and subpackages, so a newcomer opening a package
finds each file named and said in a line."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = sorted(p.parent for root in ("toolkit", "analysis") for p in (REPO / root).rglob("__init__.py"))


def names_module(doc: str, name: str) -> bool:
    """Whether ``doc`` names module ``name`` as a map entry: in double backticks (``name``, ``name.py``,
    ``name/``) or a ``:mod:`` reference ending in it, or opening a line of the map (``  name  what it does`` or
    ``- name: ...``). A word inside prose does not count: a module called ``job`` is not documented by a sentence
    about a Slurm job."""
    n = re.escape(name)
    quoted = rf"``{n}(?:\.py|/)?``|:mod:`[\w.]*\b{n}`"
    entry = rf"^[ \t]*(?:[-*][ \t]+)?{n}(?:\.py|/)?(?=[ \t:]|$)"
    return re.search(quoted, doc) is not None or re.search(entry, doc, re.MULTILINE) is not None


def test_names_module_wants_the_name_not_a_substring_or_a_word_of_prose():
    doc = "Jobs and tasks.\n\nModules:\n  jobfile  submits a Slurm job\n- ``taskset``: the task list"
    assert names_module(doc, "jobfile") and names_module(doc, "taskset")
    assert not names_module(doc, "job") and not names_module(doc, "task") and not names_module(doc, "file")


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_package_docstring_names_every_module(package):
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    parts = [p.stem for p in package.glob("*.py") if p.name != "__init__.py"]
    parts += [p.name for p in package.iterdir() if (p / "__init__.py").is_file()]
    missing = sorted(name for name in parts if not names_module(doc, name))
    assert not missing, f"{package.relative_to(REPO)}/__init__.py's docstring does not name: {', '.join(missing)}"
