"""Taskset id resolution and loading: verifiers' plugin convention first, srl's built-ins for ids nothing else has.

An id resolves the way verifiers resolves it (``verifiers.v1.utils.loaders.taskset_class``): ``my-task`` imports
``my_task`` (after ``verifiers.v1.tasksets.my_task``), whose ``__all__`` must export exactly one ``vf.Taskset``
subclass. An installed environment whose id is also a built-in's (``reverse-text``, ``alphabet-sort``) therefore
wins, as it would under verifiers; the built-in serves the id only when nothing else provides it. A researcher's own
taskset runs unchanged in srl.

``load_tasks`` builds the taskset's own config class from the srl taskset config (``id``; ``split`` and ``seed``
when set, refused when the config class has no such field; every extra typed field as is), applies ``select``
and materialises the tasks: the position in that list is the ``example_id`` used everywhere else. An eval env
never reads rows whose split field says ``train``.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import ModuleType
from typing import Any

import verifiers.v1 as vf
from pydantic import ValidationError
from verifiers.v1.utils.generic import concrete_type
from verifiers.v1.utils.loaders import taskset_class as vf_taskset_class

from toolkit.envs.fidelity import exported, plain_data
from toolkit.envs.tasksets import TasksetSource, resolve_taskset_source


def taskset_source(taskset_id: str) -> TasksetSource:
    """Where ``taskset_id`` resolves in this process (see ``toolkit.envs.tasksets.resolve_taskset_source``).

    Raises ModuleNotFoundError (verifiers' message) when nothing provides it.
    """
    source = resolve_taskset_source(taskset_id)
    if source is None:
        vf_taskset_class(taskset_id)  # raises verifiers' own ModuleNotFoundError, naming what it tried
        raise ModuleNotFoundError(f"taskset {taskset_id!r} resolves nowhere")
    return source


def taskset_module(taskset_id: str) -> ModuleType:
    """The module ``taskset_id`` imports (its ``__all__`` is where verifiers looks for a Taskset, an Env and a
    Harness). Raises ModuleNotFoundError."""
    return importlib.import_module(taskset_source(taskset_id).module)


def expose_to_verifiers(taskset_id: str) -> None:
    """Make verifiers' own loader (``verifiers.v1.utils.loaders``) import srl's built-in ``taskset_id``: the
    built-in module is entered in ``sys.modules`` under the top-level name verifiers imports for that id
    (``srl-code-lookup`` -> ``srl_code_lookup``), so an env worker runs a built-in through verifiers' rollout (its
    tool servers, Env and harness) like any installed environment. Nothing happens for an id something else
    provides (that one wins, as in verifiers). Raises ModuleNotFoundError when nothing provides the id.
    """
    import sys

    from toolkit.envs.tasksets import taskset_module_candidates

    source = taskset_source(taskset_id)
    if source.kind == "builtin":
        sys.modules.setdefault(taskset_module_candidates(taskset_id)[1], importlib.import_module(source.module))


def taskset_class(taskset_id: str) -> type[vf.Taskset]:
    """The Taskset subclass for ``taskset_id``, resolved as verifiers resolves it (an installed environment with a
    built-in's id wins over the built-in).

    Raises ModuleNotFoundError when no module has that name, TypeError when the module does not export exactly
    one Taskset subclass in ``__all__``.
    """
    source = taskset_source(taskset_id)
    if source.kind != "builtin":
        return vf_taskset_class(taskset_id)
    classes = exported(importlib.import_module(source.module), vf.Taskset)
    if len(classes) != 1:
        raise TypeError(f"built-in taskset module {source.module} must export exactly one Taskset subclass")
    return classes[0]


class TasksetFieldError(ValueError):
    """A taskset field srl would otherwise drop or misapply (a ``split`` the taskset's config has no field for, a
    field its config rejects, an eval env that would read train rows). The message names the taskset's own
    fields."""


_SRL_DEFAULTS = {"split": "train", "seed": 0}


def own_fields(config_cls: type) -> str:
    """The taskset config's own fields with their defaults, for messages: ``dataset_split = 'train', n = 8``."""
    base = set(vf.TasksetConfig.model_fields)
    own = [(n, f.default) for n, f in config_cls.model_fields.items() if n not in base]
    return ", ".join(f"{n} = {d!r}" for n, d in own) or "none beyond id, task and system_prompt"


def split_fields(config: Any) -> dict[str, Any]:
    """The fields of a built taskset config that pick rows by split (``split`` or a name ending in ``_split``)."""
    return {n: getattr(config, n) for n in type(config).model_fields if n == "split" or n.endswith("_split")}


def build_taskset(taskset_cfg: Any, *, env_name: str | None = None, eval_env: bool = False) -> vf.Taskset:
    """The taskset instance for an srl taskset config: :func:`taskset_config`'s class built on its config (which
    may load the taskset's data). Raises TasksetFieldError (see there)."""
    cls, config = taskset_config(taskset_cfg, env_name=env_name, eval_env=eval_env)
    return cls(config)


def taskset_config(
    taskset_cfg: Any, *, env_name: str | None = None, eval_env: bool = False
) -> tuple[type[vf.Taskset], vf.TasksetConfig]:
    """``(Taskset subclass, its built config)`` for an srl taskset config (``id``, ``split``, ``seed``, extra typed
    fields), without building the taskset: no data is read, so the login node's preflight runs it too.

    Every field the user set reaches the taskset's own config class or is refused: ``split``/``seed`` other than
    srl's defaults (``train``, 0) go to the fields of that name; one the class does not declare is an error naming
    the class's own fields (a taskset may call its split ``dataset_split``). Otherwise the taskset's own defaults
    apply, as in verifiers. For an eval env
    (``eval_env``) a split field that resolves to ``"train"`` is an error: held-out scores must not come from
    training rows. ``env_name`` prefixes messages. Raises TasksetFieldError.
    """
    tid = taskset_cfg.id
    who = f"env '{env_name}': " if env_name else ""
    cls = taskset_class(tid)
    config_cls = concrete_type(cls, vf.TasksetConfig, origin=vf.Taskset) or vf.TasksetConfig
    fields: dict[str, Any] = {"id": tid}
    for name, default in _SRL_DEFAULTS.items():
        # Set is judged by value: the resolved config the orchestrator reads back writes every field, so a value
        # equal to srl's default cannot be told from an unset one (the same way in every process).
        value = getattr(taskset_cfg, name)
        if value in (None, default):
            continue
        if name not in config_cls.model_fields:
            raise TasksetFieldError(
                f"{who}taskset '{tid}' has no field '{name}' (its config {config_cls.__name__} has: "
                f"{own_fields(config_cls)}); set the taskset's own field instead of '{name}'"
            )
        fields[name] = value
    fields.update({k: plain_data(v) for k, v in (taskset_cfg.model_extra or {}).items()})
    try:
        config = config_cls(**fields)
    except ValidationError as exc:
        issues = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'config'}: {e['msg']}" for e in exc.errors())
        raise TasksetFieldError(
            f"{who}taskset '{tid}' rejects its fields ({issues}); its config {config_cls.__name__} has: "
            f"{own_fields(config_cls)}"
        ) from None
    if eval_env:
        train = {n: v for n, v in split_fields(config).items() if v == "train"}
        if train:
            how = ", ".join(
                f"{n} = 'train' ({'set in the config' if n in fields else 'the taskset default'})" for n in train
            )
            raise TasksetFieldError(
                f"{who}an eval env would load the taskset's train rows: {how}; set "
                f"{' / '.join(train)} to a held-out split"
            )
    return cls, config


def _match(value: Any) -> dict[str, Any]:
    """srl's include/exclude spelling -> verifiers' TaskMatchConfig fields.

    A list mixes positions (ints or "start:stop" strings) and task ids (other strings); a mapping is taken
    as TaskMatchConfig fields (idx, ids, keys, names).
    """
    value = plain_data(value)
    if not value:
        return {}
    if isinstance(value, Mapping):
        return {k: v for k, v in value.items() if v}
    if isinstance(value, (int, str)):
        value = [value]
    idx, ids = [], []
    for item in value:
        if isinstance(item, int) or (isinstance(item, str) and all(c.isdigit() or c == ":" for c in item)):
            idx.append(item)
        else:
            ids.append(str(item))
    return {k: v for k, v in (("idx", idx), ("ids", ids)) if v}


def select_config(select: Any, default_seed: int = 0) -> vf.SelectConfig:
    """srl's ``select = {include, exclude, shuffle, skip, limit}`` as a verifiers SelectConfig.

    ``shuffle`` may be a bool (seeded by ``select.seed`` or else ``default_seed``, the taskset seed) or an int
    seed. Order of application is verifiers': include, exclude, shuffle, skip, limit.
    """
    sel = plain_data(select) or {}
    shuffle = sel.get("shuffle", False)
    seed = sel.get("seed")
    if isinstance(shuffle, int) and not isinstance(shuffle, bool):
        seed, shuffle = shuffle, True
    return vf.SelectConfig(
        include=vf.TaskMatchConfig(**_match(sel.get("include"))),
        exclude=vf.TaskMatchConfig(**_match(sel.get("exclude"))),
        shuffle=bool(shuffle),
        seed=default_seed if seed is None else int(seed),
        skip=int(sel.get("skip") or 0),
        limit=sel.get("limit"),
    )


def load_selected(
    taskset_cfg: Any, *, env_name: str | None = None, eval_env: bool = False
) -> tuple[vf.Taskset, list[vf.Task]]:
    """``(taskset, selected tasks in order)`` of a taskset config; ``example_id`` = index in the list.

    ``env_name``/``eval_env``: see :func:`taskset_config`. Raises TasksetFieldError (see there) or ValueError for an
    infinite taskset that ``select`` does not bound (``limit`` or closed idx ranges).
    """
    taskset = build_taskset(taskset_cfg, env_name=env_name, eval_env=eval_env)
    view = taskset.select(select_config(taskset_cfg.select, default_seed=taskset_cfg.seed or 0))
    if not view.bounded:
        raise ValueError(f"taskset {taskset_cfg.id!r} is infinite: bound it with select.limit")
    return taskset, list(view)


def load_tasks(taskset_cfg: Any, *, env_name: str | None = None, eval_env: bool = False) -> list[vf.Task]:
    """The selected tasks of a taskset config, in order; ``example_id`` = index in this list (see
    :func:`load_selected`)."""
    return load_selected(taskset_cfg, env_name=env_name, eval_env=eval_env)[1]
