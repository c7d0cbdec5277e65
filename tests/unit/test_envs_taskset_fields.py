"""Every taskset field reaches the taskset or is refused: a ``split`` the taskset's config cannot take is an error
naming its own fields, and an eval env never loads train rows."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.vf_differential import fixtures_on_path
from toolkit.envs.registry import TasksetFieldError, load_tasks

fixtures_on_path()


def _ns(tid: str, *, split: str = "train", seed: int = 0, **extra) -> SimpleNamespace:
    return SimpleNamespace(id=tid, split=split, seed=seed, select=None, model_extra=extra)


def test_split_the_taskset_has_no_field_for_is_refused_naming_its_fields():
    with pytest.raises(TasksetFieldError) as err:
        load_tasks(_ns("exec-check", split="test"), env_name="held-out")
    msg = str(err.value)
    assert msg.startswith("env 'held-out': taskset 'exec-check' has no field 'split'")
    assert "dataset_split = 'train'" in msg and "num_examples = 8" in msg


def test_unset_split_is_not_passed_and_the_taskset_default_applies():
    tasks = load_tasks(_ns("exec-check", num_examples=3))
    assert [t.data.a % 2 for t in tasks] == [0, 0, 0]  # train rows: even first operands


def test_eval_env_never_loads_train_rows():
    with pytest.raises(TasksetFieldError, match=r"dataset_split = 'train' \(the taskset default\)"):
        load_tasks(_ns("exec-check"), env_name="ev", eval_env=True)
    with pytest.raises(TasksetFieldError, match=r"split = 'train' \(the taskset default\)"):
        load_tasks(_ns("srl-reverse-text", split="train"), eval_env=True)
    with pytest.raises(TasksetFieldError, match="taskset 'exec-check' has no field 'seed'"):
        load_tasks(_ns("exec-check", dataset_split="test", seed=1), eval_env=True)
    held_out = load_tasks(_ns("exec-check", dataset_split="test"), eval_env=True)
    train = load_tasks(_ns("exec-check"))
    assert all(t.data.a % 2 == 1 for t in held_out)
    assert not {(t.data.a, t.data.b) for t in held_out} & {(t.data.a, t.data.b) for t in train}


def test_a_field_the_taskset_rejects_names_its_fields():
    with pytest.raises(TasksetFieldError) as err:
        load_tasks(_ns("exec-check", datasplit="test"))
    assert "datasplit: Extra inputs are not permitted" in str(err.value) and "dataset_split" in str(err.value)


def test_eval_split_mistake_is_refused_through_the_worker_spec(tmp_path):
    from toolkit.config import load_config
    from toolkit.envs.runtime import env_spec
    from toolkit.envs.server import EnvWorker

    p = tmp_path / "run.toml"
    p.write_text(
        '[[orchestrator.train.env]]\ntaskset = { id = "exec-check", num_examples = 2 }\n'
        '[[orchestrator.eval.env]]\nname = "held-out"\ntaskset = { id = "exec-check", split = "test" }\n'
    )
    cfg = load_config([p]).config
    # The orchestrator reads the run's resolved config back, every field written out: what its workers get.
    cfg = type(cfg).model_validate(cfg.model_dump(mode="json"))
    train, ev = cfg.orchestrator.train.env[0], cfg.orchestrator.eval.env[0]
    spec = env_spec(ev.model_copy(update={"name": ev.env_name}))
    assert spec["eval"] is True and spec["taskset"]["split"] == "test"
    with pytest.raises(TasksetFieldError, match="env 'held-out': taskset 'exec-check' has no field 'split'"):
        EnvWorker(spec)
    worker = EnvWorker(env_spec(train.model_copy(update={"name": train.env_name})))
    assert len(worker.tasks) == 2  # split "train" (srl's default) is not forced on a taskset without the field
