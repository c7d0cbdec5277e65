"""The login node's check of srl's built-in tasksets is answered from a cache between commands (it imports
verifiers, about 5 s of CPU per command otherwise), and only for the same spec, srl and verifiers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from toolkit.envs import probe

ROOT = Path(__file__).resolve().parents[2]


def _spec(**taskset) -> dict:
    return {
        "name": "reverse-text",
        "eval": False,
        "harness": {"id": "default", "runtime": {"type": "subprocess"}},
        "taskset": {"id": "srl-reverse-text", "split": None, "seed": None, "select": None, "extra": {}, **taskset},
    }


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(probe, "_MEMO", {})
    return tmp_path / "srl" / "probe"


def test_a_built_in_answer_is_kept_and_reused_only_for_the_same_spec(cache, monkeypatch):
    first = probe.run_probe([_spec()], python=sys.executable, extra_paths=[])
    assert first[0]["problems"] == [] and first[0]["source"]
    assert len(list(cache.glob("*.json"))) == 1

    calls = []
    real = probe.check_spec
    monkeypatch.setattr(probe, "check_spec", lambda spec, paths=(): calls.append(spec) or real(spec, paths))
    monkeypatch.setattr(probe, "_MEMO", {})  # a new command: only the disk cache is left
    assert probe.run_probe([_spec()], python=sys.executable, extra_paths=[]) == first and calls == []

    # Another spec (a field the built-in's config does not declare) is checked, and its refusal comes back.
    other = probe.run_probe([_spec(extra={"no_such_field": 1})], python=sys.executable, extra_paths=[])
    assert len(calls) == 1 and any("no_such_field" in p for p in other[0]["problems"]), other
    assert len(list(cache.glob("*.json"))) == 2


def test_a_damaged_or_foreign_cache_file_is_checked_again(cache, monkeypatch):
    probe.run_probe([_spec()], python=sys.executable, extra_paths=[])
    (entry,) = cache.glob("*.json")
    calls = []
    real = probe.check_spec
    monkeypatch.setattr(probe, "check_spec", lambda spec, paths=(): calls.append(spec) or real(spec, paths))
    for damage in ("{not json", json.dumps({"key": "another key", "result": {"problems": ["stale"]}})):
        entry.write_text(damage)
        monkeypatch.setattr(probe, "_MEMO", {})
        got = probe.run_probe([_spec()], python=sys.executable, extra_paths=[])
        assert got[0]["problems"] == []
    assert len(calls) == 2


def test_a_second_dry_run_of_the_readme_job_does_not_import_verifiers(tmp_path):
    script = (
        "import sys\n"
        "from toolkit.cli import main\n"
        "rc = main(['rl', '@', 'jobs/reverse-text/rl.toml', '--dry-run', '--output-dir', sys.argv[1]])\n"
        "print('verifiers imported:', 'verifiers' in sys.modules, 'rc', rc)\n"
    )
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    outs = []
    for i in (1, 2):
        r = subprocess.run(
            [sys.executable, "-c", script, str(tmp_path / f"out{i}")],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert r.returncode == 0, r.stderr[-3000:]
        outs.append(r.stdout.strip().splitlines()[-1])
    assert outs == ["verifiers imported: True rc 0", "verifiers imported: False rc 0"], outs
