"""srl's built-in verifiers v1 tasksets. Each module exports exactly one Taskset subclass in ``__all__``."""

BUILTIN_TASKSETS: dict[str, str] = {
    "reverse-text": "toolkit.envs.tasksets.reverse_text",
    "alphabet-sort": "toolkit.envs.tasksets.alphabet_sort",
    "arith": "toolkit.envs.tasksets.arith",
}
"""Built-in taskset id -> module. These ids win over installed packages of the same name."""


def taskset_module_candidates(taskset_id: str) -> list[str]:
    """The modules a non-built-in ``taskset_id`` resolves to, in verifiers' order (``verifiers.v1.utils.loaders``:
    a hub id ``owner/name@version`` keeps ``name``; ``-`` -> ``_``, lower case; ``verifiers.v1.tasksets.<module>``
    first, then the top-level ``<module>``)."""
    module = taskset_id.rsplit("/", 1)[-1].split("@", 1)[0].replace("-", "_").lower()
    return [f"verifiers.v1.tasksets.{module}", module]


def taskset_findable(taskset_id: str, extra_paths: list[str] = ()) -> bool:
    """Whether ``taskset_id`` would resolve here without importing anything: a built-in id, a module of
    verifiers' taskset package, or a top-level module on ``sys.path`` plus ``extra_paths`` (e.g. the job's
    PYTHONPATH). Finding a module does not prove it exports a Taskset; not finding it here does not prove the job's
    environment lacks it (a site's setup lines may change it). Raises nothing."""
    import importlib.util
    import sys
    from importlib.machinery import PathFinder
    from pathlib import Path

    if taskset_id in BUILTIN_TASKSETS:
        return True
    namespaced, top = taskset_module_candidates(taskset_id)
    if not top.isidentifier():
        return False
    try:
        spec = importlib.util.find_spec("verifiers")  # top-level: located, not imported
    except (ImportError, ValueError):
        spec = None
    for root in (spec.submodule_search_locations or []) if spec else []:
        pkg = Path(root, "v1", "tasksets", top)
        if pkg.with_suffix(".py").is_file() or (pkg / "__init__.py").is_file():
            return True
    if top in sys.modules:
        return True
    try:
        return PathFinder.find_spec(top, [*extra_paths, *sys.path]) is not None
    except (ImportError, ValueError):
        return False
