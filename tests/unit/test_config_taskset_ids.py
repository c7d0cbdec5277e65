"""Taskset ids are checked before anything is submitted: a typo of a built-in id is an error, and so is an id no
module answers to with the job's interpreter and PYTHONPATH; a taskset module is imported only in that interpreter's
own process, never in srl's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from config_cases import config, errors_of, validate, warnings_of

from toolkit.envs.tasksets import BUILTIN_TASKSETS, taskset_module_candidates, taskset_unresolved_reason

ROOT = Path(__file__).resolve().parents[2]


def _train(taskset_id: str, **extra) -> dict:
    return config({"orchestrator": {"train": {"env": [{"taskset": {"id": taskset_id}}]}}}, **extra)


def test_typo_of_a_built_in_id_is_an_error_naming_the_field_and_the_id_meant():
    builtin = max(BUILTIN_TASKSETS)
    typo = builtin[:-2] + builtin[-1]  # one letter dropped
    text = errors_of(_train(typo))
    assert "orchestrator.train.env[0].taskset.id" in text and f"did you mean '{builtin}'" in text
    assert all(i in text for i in BUILTIN_TASKSETS)  # the built-in ids are listed
    eval_typo = config(
        {"orchestrator": {"eval": {"env": [{"taskset": {"id": builtin.replace("-", "_"), "split": "test"}}]}}}
    )
    assert "orchestrator.eval.env[0].taskset.id" in errors_of(eval_typo)


def test_an_id_no_module_answers_to_is_an_error_naming_where_it_looked():
    text = errors_of(_train("my-own-task"))
    assert "orchestrator.train.env[0].taskset.id" in text and "unknown taskset 'my-own-task'" in text
    assert "'verifiers.v1.tasksets.my_own_task' then 'my_own_task'" in text and "PYTHONPATH" in text


TASKSET = """
import verifiers.v1 as vf

class OwnTaskset(vf.Taskset[vf.Task, vf.TasksetConfig]):
    def load(self):
        return []

__all__ = ["OwnTaskset"]
"""


def test_a_module_on_the_jobs_pythonpath_or_sys_path_resolves(tmp_path, monkeypatch):
    (tmp_path / "my_own_task.py").write_text(TASKSET)
    assert ".taskset" not in warnings_of(_train("my-own-task", env_vars={"PYTHONPATH": f"/nowhere:{tmp_path}"}))
    assert ".taskset" not in warnings_of(
        _train("my-own-task", orchestrator={"env_vars": {"PYTHONPATH": str(tmp_path)}})
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert (
        taskset_unresolved_reason("owner/My-Own-Task@1.0") is None
    )  # hub id: owner and version dropped, as verifiers does
    assert "my_own_task" not in sys.modules  # imported only in the probe's own process


def test_verifiers_own_tasksets_and_built_ins_resolve():
    assert taskset_unresolved_reason("srl-reverse-text") is None and taskset_unresolved_reason("srl-arith") is None
    assert taskset_unresolved_reason("textarena") is None  # shipped in verifiers.v1.tasksets (by path)
    assert taskset_module_candidates("team/Text-Arena@2") == ["verifiers.v1.tasksets.text_arena", "text_arena"]
    assert taskset_unresolved_reason("no such task") and taskset_unresolved_reason("../etc")


def test_the_check_imports_no_taskset_module_of_the_users_and_no_torch(tmp_path):
    (tmp_path / "my_own_task.py").write_text(TASKSET)
    probe = (
        "import sys; sys.path.insert(0, 'tests')\n"
        "from config_cases import config\n"
        "from config_cases import validate\n"
        f"validate(config({{'env_vars': {{'PYTHONPATH': {str(tmp_path)!r}}},\n"
        "    'orchestrator': {'train': {'env': [{'taskset': {'id': 'my-own-task'}}]}}}))\n"
        "print(sorted(m for m in ('my_own_task', 'torch', 'vllm', 'transformers') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=300, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_built_in_ids_validate_without_taskset_findings():
    found = validate(config()).warnings
    assert not [w for w in found if "taskset" in str(w) and ".id" in str(w)]
