"""Every package's ``__init__.py`` docstring maps its modules and subpackages, so a newcomer opening a package
finds each file named and said in a line."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = sorted(p.parent for root in ("toolkit", "analysis") for p in (REPO / root).rglob("__init__.py"))


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_package_docstring_names_every_module(package):
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    parts = [p.stem for p in package.glob("*.py") if p.name != "__init__.py"]
    parts += [p.name for p in package.iterdir() if (p / "__init__.py").is_file()]
    missing = sorted(name for name in parts if name not in doc)
    assert not missing, f"{package.relative_to(REPO)}/__init__.py's docstring does not name: {', '.join(missing)}"
