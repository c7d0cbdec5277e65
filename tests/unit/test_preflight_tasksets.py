"""Each env's taskset is loaded on the login node as the job's env workers will load it (the job's interpreter and
PYTHONPATH, no data) by every command that preflights a config: `srl rl` (and its dry run), an SFT run's online
eval, every sweep point and the eval gate. A field the taskset's config does not declare and an id that resolves
nowhere are errors before anything is written or started; relative env_vars paths are taken from where srl runs."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from config_cases import config, errors_of, validate

from toolkit.config import ConfigError
from toolkit.envs.tasksets import BUILTIN_TASKSETS

ROOT = Path(__file__).resolve().parents[2]

# verifiers' published reverse-text keeps its split in ``dataset_split``; its data must never be read here.
PUBLISHED = textwrap.dedent("""
    import verifiers.v1 as vf

    class PublishedConfig(vf.TasksetConfig):
        dataset_name: str = "hub/reverse-text"
        dataset_split: str = "train"

    class PublishedTaskset(vf.Taskset[vf.Task, PublishedConfig]):
        def load(self):
            raise RuntimeError("data loaded on the login node")

    __all__ = ["PublishedTaskset"]
""")


def _published(root: Path, module: str = "reverse_text") -> Path:
    (root / module).mkdir(parents=True)
    (root / module / "__init__.py").write_text(PUBLISHED)
    return root


def _envs(train_id: str, eval_id: str, **taskset) -> dict:
    return {
        "orchestrator": {
            "train": {"env": [{"taskset": {"id": train_id}}]},
            "eval": {"env": [{"taskset": {"id": eval_id, "split": "test", **taskset}}]},
        }
    }


def _refusal_named(text: str, root: Path) -> None:
    assert "orchestrator.eval.env[0].taskset" in text
    assert (
        "taskset 'reverse-text'" in text and f"module reverse_text at {root / 'reverse_text' / '__init__.py'}" in text
    )
    assert "has no field 'split'" in text and "dataset_split = 'train'" in text and "dataset_name" in text


def test_a_split_the_resolved_taskset_does_not_declare_is_refused_naming_module_and_fields(tmp_path):
    root = _published(tmp_path / "envs")
    builtin = min(BUILTIN_TASKSETS)
    text = errors_of(config(_envs(builtin, "reverse-text"), env_vars={"PYTHONPATH": str(root)}))
    _refusal_named(text, root)
    assert "reverse_text" not in sys.modules  # loaded in the job's interpreter, not in srl's process


def test_the_job_sees_the_orchestrators_pythonpath_not_the_runs(tmp_path):
    root = _published(tmp_path / "envs")
    builtin = min(BUILTIN_TASKSETS)
    # The orchestrator's own PYTHONPATH replaces the run's in its process: the published module is out of reach.
    data = config(
        _envs(builtin, "reverse-text"),
        env_vars={"PYTHONPATH": str(root)},
        orchestrator={"env_vars": {"PYTHONPATH": str(tmp_path / "elsewhere")}},
    )
    try:  # srl's own reverse-text answers when it has that id; an error naming the id when it does not
        assert any("srl's built-in" in n for n in validate(data).notices if "'reverse-text'" in n)
    except ConfigError as e:
        assert "unknown taskset 'reverse-text'" in str(e) and str(tmp_path / "elsewhere") in str(e)


def test_fields_the_taskset_rejects_and_eval_envs_on_train_rows_are_refused_here(tmp_path):
    root = _published(tmp_path / "envs")
    builtin = min(BUILTIN_TASKSETS)
    pp = {"env_vars": {"PYTHONPATH": str(root)}}
    text = errors_of(config(_envs(builtin, builtin, no_such_field=3), **pp))
    assert "rejects its fields" in text and "no_such_field" in text
    # Without split, the published taskset's own default (dataset_split = 'train') would feed the eval train rows.
    data = config(_envs(builtin, "reverse-text"), **pp)
    data["orchestrator"]["eval"]["env"][0]["taskset"] = {"id": "reverse-text", "dataset_split": "train"}
    assert "eval env would load the taskset's train rows" in errors_of(data)
    data["orchestrator"]["eval"]["env"][0]["taskset"]["dataset_split"] = "test"
    assert any("resolves to module reverse_text" in n for n in validate(data).notices)


def test_a_mistyped_id_is_an_error_naming_it_where_it_looked_and_close_ids(tmp_path):
    root = tmp_path / "envs"
    root.mkdir()
    (root / "sum_answer.py").write_text("raise SystemExit('a module is never imported to suggest its id')\n")
    builtin = min(BUILTIN_TASKSETS)
    text = errors_of(config(_envs("sum-answr", builtin), env_vars={"PYTHONPATH": str(root)}))
    assert "orchestrator.train.env[0].taskset.id" in text and "unknown taskset 'sum-answr'" in text
    assert "'verifiers.v1.tasksets.sum_answr' then 'sum_answr'" in text and str(root) in text
    assert sys.executable in text and "did you mean 'sum-answer'" in text
    # No module close to it anywhere: still an error, saying so.
    text = errors_of(config(_envs("zzqx-task", builtin)))
    assert "unknown taskset 'zzqx-task'" in text and "no id close to it resolves" in text


def test_sweep_points_sft_eval_and_the_eval_gate_refuse_it_too(tmp_path, monkeypatch):
    from toolkit.commands.sft import load as load_sft
    from toolkit.evalgate import main as eval_main
    from toolkit.sweep import load_sweep, point_configs

    root = _published(tmp_path / "envs")
    builtin = min(BUILTIN_TASKSETS)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rl.toml").write_text(
        textwrap.dedent(f'''
        max_steps = 2
        output_dir = "{tmp_path / "out"}"
        [env_vars]
        PYTHONPATH = "envs"
        [orchestrator]
        batch_size = 16
        group_size = 4
        [[orchestrator.train.env]]
        taskset = {{ id = "{builtin}" }}
        [[orchestrator.eval.env]]
        taskset = {{ id = "reverse-text", split = "test" }}
    ''')
    )
    (tmp_path / "sweep.toml").write_text('[sweep]\nname = "s"\nbase = ["rl.toml"]\nseeds = [0, 1]\n')
    with pytest.raises(ConfigError) as e:
        point_configs(load_sweep(tmp_path / "sweep.toml"))
    _refusal_named(str(e.value), root)
    with pytest.raises(ConfigError) as e:
        eval_main(["validate", "@", str(tmp_path / "rl.toml")])
    _refusal_named(str(e.value), root)
    (tmp_path / "data.jsonl").write_text('{"prompt": "a", "completion": "b"}\n' * 4)
    (tmp_path / "sft.toml").write_text(
        textwrap.dedent(f'''
        max_steps = 2
        output_dir = "{tmp_path / "out"}"
        [env_vars]
        PYTHONPATH = "envs"
        [data]
        name = "data.jsonl"
        [eval]
        interval = 1
        [[eval.env]]
        taskset = {{ id = "reverse-text", split = "test" }}
    ''')
    )
    with pytest.raises(ConfigError) as e:
        load_sft([tmp_path / "sft.toml"], [])
    assert "eval.env[0].taskset" in str(e.value) and "has no field 'split'" in str(e.value)
    assert f"module reverse_text at {root / 'reverse_text' / '__init__.py'}" in str(e.value)


def test_relative_env_var_paths_become_absolute_from_where_srl_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    data = config(
        env_vars={"PYTHONPATH": f"my_envs{os.pathsep}/abs{os.pathsep}", "HF_HOME": "~/hf", "NOT_A_PATH": "rel"},
        orchestrator={"env_vars": {"PYTHONPATH": "../up"}},
        trainer={"env_vars": {"TRITON_CACHE_DIR": "cache"}},
    )
    checked = validate(data)
    cfg = checked.config
    assert cfg.env_vars["PYTHONPATH"] == os.pathsep.join([str(tmp_path / "my_envs"), "/abs", ""])
    assert cfg.env_vars["HF_HOME"] == str(Path("~/hf").expanduser()) and cfg.env_vars["NOT_A_PATH"] == "rel"
    assert cfg.orchestrator.env_vars["PYTHONPATH"] == str(tmp_path / ".." / "up")
    assert cfg.trainer.env_vars["TRITON_CACHE_DIR"] == str(tmp_path / "cache")
    assert any("env_vars.PYTHONPATH: my_envs" in n for n in checked.notices)


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("PYTHONPATH", f"my_envs{os.pathsep}$SCRATCH/envs", "does not expand $VARIABLES"),
        ("HF_HOME", "${SCRATCH}/hf", "does not expand $VARIABLES"),
        ("PYTHONPATH", "~no-such-user-srl/envs", "'~no-such-user-srl' names no user"),
    ],
)
def test_env_var_paths_the_job_would_not_get_as_meant_are_refused(tmp_path, monkeypatch, key, value, says):
    # Nothing expands a $VARIABLE on the way to the job's processes (they got "$SCRATCH/envs" as written), and
    # "~user" of no user raised RuntimeError out of pathlib (a traceback).
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as e:
        validate(config(orchestrator={"env_vars": {key: value}}))
    (issue,) = e.value.issues
    assert issue.path == f"orchestrator.env_vars.{key}" and says in issue.message and value in issue.message


def test_dry_run_with_a_relative_pythonpath_refuses_the_published_taskset_from_another_directory(tmp_path):
    """The reported late failure, end to end through the CLI: `srl rl --dry-run` from the directory holding
    ``my_envs``, with the relative PYTHONPATH the job would have resolved in its run directory."""
    _published(tmp_path / "my_envs")
    builtin = min(BUILTIN_TASKSETS)
    (tmp_path / "rl.toml").write_text(
        textwrap.dedent(f'''
        max_steps = 2
        output_dir = "out"
        env_vars = {{ PYTHONPATH = "my_envs" }}
        [orchestrator]
        batch_size = 16
        group_size = 4
        [[orchestrator.train.env]]
        taskset = {{ id = "{builtin}" }}
        [[orchestrator.eval.env]]
        taskset = {{ id = "reverse-text", split = "test" }}
    ''')
    )
    out = subprocess.run(
        [sys.executable, "-m", "toolkit.cli", "rl", "@", "rl.toml", "--dry-run"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert out.returncode != 0
    _refusal_named(out.stderr, tmp_path / "my_envs")
    assert not (tmp_path / "out").exists()  # refused before the run directory is written
