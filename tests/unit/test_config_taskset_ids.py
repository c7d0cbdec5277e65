"""Taskset ids are checked before anything is submitted: a typo of a built-in id is an error, an id no module
answers to here is a warning (the job's environment may still provide it), and the check imports nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from config_cases import config, errors_of, validate, warnings_of

from toolkit.envs.tasksets import taskset_module_candidates, taskset_unresolved_reason

ROOT = Path(__file__).resolve().parents[2]


def _train(taskset_id: str, **extra) -> dict:
    return config({"orchestrator": {"train": {"env": [{"taskset": {"id": taskset_id}}]}}}, **extra)


def test_typo_of_a_built_in_id_is_an_error_naming_the_field_and_the_id_meant():
    text = errors_of(_train("revers-text"))
    assert "orchestrator.train.env[0].taskset.id" in text and "did you mean 'srl-reverse-text'" in text
    assert "alphabet-sort" in text  # the allowed ids are listed
    eval_typo = config({"orchestrator": {"eval": {"env": [{"taskset": {"id": "alphabet_sort", "split": "test"}}]}}})
    assert "orchestrator.eval.env[0].taskset.id" in errors_of(eval_typo)


def test_an_id_no_module_answers_to_is_a_warning_not_an_error():
    text = warnings_of(_train("my-own-task"))
    assert "orchestrator.train.env[0].taskset.id" in text
    assert "'verifiers.v1.tasksets.my_own_task' or 'my_own_task'" in text and "PYTHONPATH" in text


def test_a_module_on_the_jobs_pythonpath_or_sys_path_resolves(tmp_path, monkeypatch):
    (tmp_path / "my_own_task.py").write_text("raise SystemExit('must not be imported by validation')\n")
    assert ".taskset.id" not in warnings_of(_train("my-own-task", env_vars={"PYTHONPATH": f"/nowhere:{tmp_path}"}))
    assert ".taskset.id" not in warnings_of(
        _train("my-own-task", orchestrator={"env_vars": {"PYTHONPATH": str(tmp_path)}})
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert taskset_unresolved_reason("owner/My-Own-Task@1.0") is None  # hub id: owner and version dropped, as verifiers does
    assert "my_own_task" not in sys.modules


def test_verifiers_own_tasksets_and_built_ins_resolve():
    assert taskset_unresolved_reason("srl-reverse-text") is None and taskset_unresolved_reason("srl-arith") is None
    assert taskset_unresolved_reason("textarena") is None  # shipped in verifiers.v1.tasksets
    assert taskset_module_candidates("team/Text-Arena@2") == ["verifiers.v1.tasksets.text_arena", "text_arena"]
    assert taskset_unresolved_reason("no such task") and taskset_unresolved_reason("../etc")


def test_the_check_imports_neither_verifiers_nor_the_taskset():
    probe = (
        "import sys; sys.path.insert(0, 'tests')\n"
        "from config_cases import config\n"
        "from config_cases import validate\n"
        "validate(config({'orchestrator': {'train': {'env': [{'taskset': {'id': 'textarena'}}]}}}))\n"
        "print(sorted(m for m in ('verifiers', 'torch', 'vllm') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=60,
                         check=False)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_built_in_ids_validate_without_taskset_findings():
    found = validate(config()).warnings
    assert not [w for w in found if "taskset" in str(w) and ".id" in str(w)]
