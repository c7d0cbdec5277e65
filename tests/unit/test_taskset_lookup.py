"""Hostile taskset ids and PYTHONPATHs for the pre-submission look-up: it raises nothing but ConfigError, imports no
taskset module into srl's process (the job's interpreter does, in its own process), refuses with the reason when an
id cannot be a taskset or its module fails as the job's env worker would, and stays quiet for ids that resolve."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from config_cases import config, validate
from prereqs import missing

from toolkit.config import ConfigError
from toolkit.envs.tasksets import taskset_unresolved_reason

ROOT = Path(__file__).resolve().parents[2]
BOMB = "raise SystemExit('imported by validation')\n"


def _train(taskset_id: str, **extra) -> dict:
    return config({"orchestrator": {"train": {"env": [{"taskset": {"id": taskset_id}}]}}}, **extra)


def _id_findings(data: dict) -> str:
    """The taskset warnings of ``data``, or the ConfigError text: anything else raised fails the test."""
    try:
        return "\n".join(str(w) for w in validate(data).warnings if ".taskset" in str(w))
    except ConfigError as e:
        return str(e)


@pytest.mark.parametrize(
    "tid",
    [
        "owner/",
        "x@",
        "@",
        "/",
        ".",
        "..",
        "../x",
        "a.b",
        "os.path",
        "ünï-cødé",
        "with spaces",
        "x" * 5000,
        "owner/" + "y" * 300 + "@1",
        "json",
        "os",
        "sys",
        "tab\there",
        "nul\0byte",
        "-",
    ],
)
def test_odd_ids_give_a_finding_never_another_exception(tid):
    text = _id_findings(_train(tid))
    assert ".taskset.id" in text
    assert max(map(len, text.splitlines())) < 1200  # a 5000-character id is clipped, not echoed


@pytest.mark.parametrize(
    "path", ["\0", ":::", "/" + "p" * 5000, "relative/dir", "~/nowhere", "$HOME/x", str(ROOT / "pyproject.toml")]
)
def test_odd_pythonpath_values_never_raise(path):
    for data in (
        _train("my-own-task", env_vars={"PYTHONPATH": path}),
        _train("my-own-task", orchestrator={"env_vars": {"PYTHONPATH": path}}),
    ):
        # A NUL byte or a $VARIABLE (which nothing would expand for the job) is refused by the config's own rules.
        text = _id_findings(data)
        assert ".taskset.id" in text or "NUL byte" in text or "does not expand $VARIABLES" in text


def test_a_pythonpath_entry_with_a_nul_byte_does_not_hide_the_next_one(tmp_path):
    (tmp_path / "my_own_task.py").write_text(BOMB)
    assert taskset_unresolved_reason("my-own-task", ["bad\0path", str(tmp_path)]) is None
    assert "my_own_task" not in sys.modules


def test_modules_and_packages_that_raise_on_import_are_refused_as_the_job_would_fail(tmp_path):
    (tmp_path / "bomb_task.py").write_text(BOMB)
    (tmp_path / "bomb_pkg").mkdir()
    (tmp_path / "bomb_pkg" / "__init__.py").write_text(BOMB)
    pp = {"env_vars": {"PYTHONPATH": str(tmp_path)}}
    text = _id_findings(_train("bomb-task", **pp))
    assert f"module bomb_task at {tmp_path / 'bomb_task.py'}" in text and "raised SystemExit: imported by" in text
    assert "from bomb_pkg raised SystemExit" in _id_findings(_train("owner/Bomb-Pkg@2", **pp))
    assert "bomb_task" not in sys.modules and "bomb_pkg" not in sys.modules


def test_a_namespace_package_is_no_taskset(tmp_path):
    (tmp_path / "loose_dir").mkdir()  # no __init__.py: nothing can export a Taskset from it
    (tmp_path / "loose_dir" / "x.py").write_text(BOMB)
    text = _id_findings(_train("loose-dir", env_vars={"PYTHONPATH": str(tmp_path)}))
    assert "namespace package" in text and "did you mean" not in text


def test_standard_library_names_are_refused_and_a_pythonpath_shadowing_them_breaks_the_job_here_too(tmp_path):
    assert "standard library" in _id_findings(_train("json"))
    assert "compiled into Python" in _id_findings(_train("sys"))
    # PYTHONPATH comes before the standard library on sys.path: every Python program of the job imports this json.
    (tmp_path / "json.py").write_text(BOMB)
    text = _id_findings(_train("json", env_vars={"PYTHONPATH": str(tmp_path)}))
    assert "could not check the tasksets" in text and "imported by validation" in text


def test_dotted_ids_resolve_only_inside_verifiers_package(tmp_path):
    # verifiers looks for the parent in its own taskset package first (find_spec raises there): never top-level.
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text(BOMB)
    (tmp_path / "pkg" / "sub.py").write_text(BOMB)
    assert "dotted id" in taskset_unresolved_reason("pkg.sub", [str(tmp_path)])
    assert "pkg" not in sys.modules


def test_an_editable_install_resolves_through_its_import_hook(tmp_path):
    """``pip install -e`` adds a meta-path finder, not a path entry: a taskset installed so must not be warned
    about. srl itself is installed so in the dev venv (``analysis`` is one of its top-level packages)."""
    probe = (
        "import importlib.util, sys\n"
        "from importlib.machinery import PathFinder\n"
        "from toolkit.envs.tasksets import taskset_unresolved_reason\n"
        "print(PathFinder.find_spec('analysis', sys.path) is None, importlib.util.find_spec('analysis') is not None)\n"
        "print(taskset_unresolved_reason('analysis'), 'analysis' in sys.modules)\n"
    )
    # -I: no current directory or PYTHONPATH on sys.path, so only the installation can provide the package.
    out = subprocess.run(
        [sys.executable, "-I", "-c", probe], capture_output=True, text=True, cwd=tmp_path, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    hook_only, installed = out.stdout.split("\n")[0].split()
    if installed != "True":
        missing("srl's analysis package is not installed in this interpreter (scripts/setup.sh installs it)")
    assert out.stdout.split("\n")[1] == "None False", (hook_only, out.stdout)


def test_a_pythonpath_entry_that_is_a_file_is_named_as_one(tmp_path):
    # Python skips such an entry without a word; the refusal only listed it among the places looked.
    module = tmp_path / "my_own_task.py"
    module.write_text("x = 1\n")
    text = _id_findings(_train("my-own-task", env_vars={"PYTHONPATH": f"{module}{os.pathsep}{tmp_path / 'gone'}"}))
    assert f"{module} is a file: put the directory that holds it on PYTHONPATH" in text
    assert f"{tmp_path / 'gone'} is missing" in text
