"""README tells a newcomer what they meet first (issue 34 items 4 and 10).

- After ``scripts/setup.sh``, ``srl`` is not on PATH: the script prints the activate line and README says so.
- "A taskset of your own": how an id maps to a module, what the module exports, what ``srl eval validate`` treats
  as a known-good reply, and a folder-to-first-run example whose module and job pass ``srl eval validate`` as
  written in README.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()


def _section(title: str) -> str:
    start = README.index(f"## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start:] if end < 0 else README[start:end]


def test_setup_prints_how_to_get_srl_on_path_and_readme_says_so() -> None:
    script = (REPO / "scripts" / "setup.sh").read_text()
    assert re.search(r'^echo ".*source \$\(pwd\)/\.venv/bin/activate"$', script, re.MULTILINE), script[-400:]
    two = _section("The two commands")
    assert "source .venv/bin/activate" in two and ".venv/bin/srl" in two


def test_readme_says_how_a_taskset_id_maps_to_its_module() -> None:
    own = _section("A taskset of your own")
    assert "`sum-answer`" in own and "`sum_answer`" in own and "__all__" in own
    assert "known-good reply" in own and "data.answer" in own and "reference_replies()" in own


def test_the_taskset_of_your_own_passes_validate_as_written(tmp_path: Path) -> None:
    own = _section("A taskset of your own")
    (module,) = re.findall(r"```python\n(.*?)```", own, re.DOTALL)
    (job,) = re.findall(r"```toml\n(.*?)```", own, re.DOTALL)
    folder = tmp_path / "my_tasks"
    folder.mkdir()
    (folder / "sum_answer.py").write_text(module)
    (folder / "rl.toml").write_text(job)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "toolkit.cli",
            "eval",
            "validate",
            "@",
            "my_tasks/rl.toml",
            "--env-vars.PYTHONPATH",
            str(folder),
            "--no-rich",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert r.returncode == 0 and "GATE PASSED" in r.stdout, r.stdout + r.stderr
    assert "FAIL" not in r.stdout
