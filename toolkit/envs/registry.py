"""Taskset id resolution and loading: srl's built-in ids first, else verifiers' plugin convention.

An id that is not built in resolves the way verifiers resolves it (``verifiers.v1.utils.loaders.taskset_class``):
``my-task`` imports ``my_task`` (after ``verifiers.v1.tasksets.my_task``), whose ``__all__`` must export exactly
one ``vf.Taskset`` subclass. A researcher's own taskset therefore runs unchanged in srl.

``load_tasks`` builds the taskset's own config class from the srl taskset config (``id``; ``split`` and ``seed``
when the config class declares them; every extra typed field as is), applies ``select`` and materialises the
tasks: the position in that list is the ``example_id`` used everywhere else.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

import verifiers.v1 as vf
from verifiers.v1.utils.generic import concrete_type
from verifiers.v1.utils.loaders import taskset_class as vf_taskset_class

from toolkit.envs.tasksets import BUILTIN_TASKSETS


def taskset_class(taskset_id: str) -> type[vf.Taskset]:
    """The Taskset subclass for ``taskset_id``.

    Raises ModuleNotFoundError when no module has that name, TypeError when the module does not export exactly
    one Taskset subclass in ``__all__``.
    """
    module_name = BUILTIN_TASKSETS.get(taskset_id)
    if module_name is None:
        return vf_taskset_class(taskset_id)
    module = importlib.import_module(module_name)
    classes = [
        obj
        for name in getattr(module, "__all__", ())
        if isinstance(obj := getattr(module, name, None), type) and issubclass(obj, vf.Taskset)
    ]
    if len(classes) != 1:
        raise TypeError(f"built-in taskset module {module_name} must export exactly one Taskset subclass")
    return classes[0]


def _plain(value: Any) -> Any:
    """A pydantic model / namespace / mapping as plain data (dicts and lists)."""
    if value is None:
        return None
    if hasattr(value, "model_dump"):
        return value.model_dump()
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if hasattr(value, "__dict__") and not isinstance(value, type):
        return {k: _plain(v) for k, v in vars(value).items() if not k.startswith("_")}
    return value


def _extra_fields(taskset_cfg: Any) -> dict[str, Any]:
    extra = getattr(taskset_cfg, "model_extra", None) or {}
    return {k: _plain(v) for k, v in extra.items()}


def build_taskset(taskset_cfg: Any) -> vf.Taskset:
    """The taskset instance for an srl taskset config (``id``, ``split``, ``seed``, extra typed fields).

    ``split``/``seed`` are passed only to a config class that declares them (an external taskset may not).
    Raises pydantic.ValidationError for fields the taskset's config rejects.
    """
    cls = taskset_class(taskset_cfg.id)
    config_cls = concrete_type(cls, vf.TasksetConfig, origin=vf.Taskset) or vf.TasksetConfig
    fields: dict[str, Any] = {"id": taskset_cfg.id}
    for name in ("split", "seed"):
        value = getattr(taskset_cfg, name, None)
        if value is not None and name in config_cls.model_fields:
            fields[name] = value
    fields.update(_extra_fields(taskset_cfg))
    return cls(config_cls(**fields))


def _match(value: Any) -> dict[str, Any]:
    """srl's include/exclude spelling -> verifiers' TaskMatchConfig fields.

    A list mixes positions (ints or "start:stop" strings) and task ids (other strings); a mapping is taken
    as TaskMatchConfig fields (idx, ids, keys, names).
    """
    value = _plain(value)
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
    sel = _plain(select) or {}
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


def load_selected(taskset_cfg: Any, *, env_name: str | None = None) -> tuple[vf.Taskset, list[vf.Task]]:
    """``(taskset, selected tasks in order)`` of a taskset config; ``example_id`` = index in the list.

    ``env_name`` names the env in error messages (default: the taskset id). Raises ValueError for an infinite
    taskset that ``select`` does not bound (``limit`` or closed idx ranges).
    """
    taskset = build_taskset(taskset_cfg)
    seed = getattr(taskset_cfg, "seed", None) or 0
    view = taskset.select(select_config(getattr(taskset_cfg, "select", None), default_seed=seed))
    if not view.bounded:
        raise ValueError(f"taskset {taskset_cfg.id!r} is infinite: bound it with select.limit")
    return taskset, list(view)


def load_tasks(taskset_cfg: Any) -> list[vf.Task]:
    """The selected tasks of a taskset config, in order; ``example_id`` = index in this list (see
    :func:`load_selected`)."""
    return load_selected(taskset_cfg)[1]
