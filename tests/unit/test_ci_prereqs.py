"""A missing prerequisite skips a test on a developer's machine and fails it under CI (tests/prereqs.py); a missing
Slurm cluster is one of them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import prereqs
import pytest
from slurm_cluster import ClusterUnavailable, LocalSlurmCluster

TESTS = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("in_ci", [False, True])
def test_missing_module_skips_locally_and_fails_under_ci(monkeypatch, in_ci):
    monkeypatch.setattr(prereqs, "IN_CI", in_ci)
    expected = pytest.fail.Exception if in_ci else pytest.skip.Exception
    with pytest.raises(expected, match="cannot import srl_no_such_module") as e:
        prereqs.need_module("srl_no_such_module")
    assert str(e.value).startswith("CI=true, but ") == in_ci


def test_ci_problems_name_each_missing_piece(monkeypatch):
    monkeypatch.setitem(prereqs.CI_MODULES, "srl_no_such_module", "a module no machine has")
    monkeypatch.setitem(prereqs.CI_PROGRAMS, "srl-no-such-program", ("a program no machine has", lambda: None))
    problems = prereqs.ci_problems()
    assert "module srl_no_such_module not found: a module no machine has" in problems
    assert "program srl-no-such-program not found: a program no machine has" in problems


@pytest.mark.parametrize("in_ci", [False, True])
def test_importorskip_fails_under_ci(tmp_path, in_ci):
    # need_module is what the suite calls; a test that still calls pytest.importorskip must not pass CI by skipping.
    (tmp_path / "test_module_level.py").write_text('import pytest\npytest.importorskip("srl_no_such_module")\n')
    (tmp_path / "test_in_test.py").write_text(
        'import pytest\n\ndef test_x():\n    pytest.importorskip("srl_no_such_module")\n'
    )
    env = {**os.environ, "CI": "true" if in_ci else "", "PYTHONPATH": str(TESTS)}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "prereqs",
            "-p",
            "no:cacheprovider",
            "-o",
            "addopts=",
            "--continue-on-collection-errors",
            "-q",
            "-rA",
            "--rootdir",
            str(tmp_path),
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
        check=False,
    )
    out = proc.stdout + proc.stderr
    if in_ci:
        assert proc.returncode == pytest.ExitCode.TESTS_FAILED, out
        assert out.count("CI=true, but could not import 'srl_no_such_module'") >= 2, out
        assert "1 failed" in out and "1 error" in out, out
    else:
        assert proc.returncode == pytest.ExitCode.OK and "2 skipped" in out, out


def _fake_setup(tmp_path: Path, rc: int, message: str) -> Path:
    script = tmp_path / "setup-slurm.sh"
    script.write_text(f"#!/usr/bin/env bash\n[[ $1 == status ]] && exit 1\necho '{message}' >&2\nexit {rc}\n")
    return script


def test_cluster_that_cannot_be_installed_is_unavailable(tmp_path):
    cluster = LocalSlurmCluster(_fake_setup(tmp_path, 3, "[setup-slurm] ERROR: must run as root"))
    with pytest.raises(ClusterUnavailable, match="must run as root"):
        cluster.start()


def test_cluster_without_sbatch_on_path_is_unavailable(tmp_path, monkeypatch):
    # The setup script "succeeds" but this process cannot find sbatch: every submission would fail later.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    os.symlink("/bin/bash" if Path("/bin/bash").exists() else "/usr/bin/bash", bin_dir / "bash")
    monkeypatch.setenv("PATH", str(bin_dir))
    cluster = LocalSlurmCluster(_fake_setup(tmp_path, 0, "up"))
    with pytest.raises(ClusterUnavailable, match="sbatch is not on PATH"):
        cluster.start()
