"""Every shipped job config dry-runs the way its own usage comment says, without a traceback.

Found by this file: ``srl rl @ jobs/multi-env/rl.toml`` (two train envs) crashed with a pydantic traceback, because
the automatic run name joins env names with ``+`` and ``run.name`` refused ``+``.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_USAGE = re.compile(r"^#\s+(srl (?:rl|inference|sweep) @ .*?)\s*$")


def _usages() -> list[str]:
    found = []
    for f in sorted((ROOT / "jobs").rglob("*.toml")):
        for line in f.read_text().splitlines():
            m = _USAGE.match(line)
            if m:
                found.append(m.group(1))
    return sorted(set(found))


USAGES = _usages()


def test_usages_found():
    assert any("multi-env" in u for u in USAGES) and any(u.startswith("srl inference") for u in USAGES)


@pytest.mark.parametrize("usage", USAGES)
def test_job_usage_dry_runs(usage, tmp_path, capsys, monkeypatch):
    from toolkit.cli import main

    monkeypatch.chdir(ROOT)
    argv = shlex.split(usage)[1:] + ["--dry-run", "--output-dir", str(tmp_path / "out")]
    rc = main(argv)
    out = "".join(capsys.readouterr())
    assert rc == 0 and "Traceback" not in out, out


def test_auto_run_name_of_several_envs_is_a_valid_run_name():
    from toolkit.config import load_config
    from toolkit.launch.prepare import auto_run_name

    loaded = load_config([ROOT / "jobs/multi-env/rl.toml"])
    name = auto_run_name(loaded)
    assert "+" in name
    loaded.config.run.name = name  # validated on assignment
