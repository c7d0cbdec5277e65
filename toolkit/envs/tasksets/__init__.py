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
    """Whether ``taskset_id`` would resolve here without importing anything (see ``taskset_unresolved_reason``).
    Raises nothing."""
    return taskset_unresolved_reason(taskset_id, extra_paths) is None


def taskset_unresolved_reason(taskset_id: str, extra_paths: list[str] = ()) -> str | None:
    """None when ``taskset_id`` would resolve here, else why not (a phrase for a config finding).

    Resolves, as ``verifiers.v1.utils.loaders`` would import it: a built-in id; a module of verifiers' own taskset
    package (``verifiers/v1/tasksets/<module>``, dotted submodules included); else the top-level ``<module>`` found
    on ``extra_paths`` (the job's PYTHONPATH, searched first as Python does) then ``sys.path`` and the import
    hooks (``pip install -e`` installs a finder, not a path entry). Never imports the module, verifiers or torch.
    Not a taskset: a dotted id outside verifiers' package (verifiers looks for the parent inside its own package
    first and fails there), a namespace package (a directory without ``__init__.py`` exports nothing), a module of
    the standard library not shadowed by ``extra_paths``. Finding a module does not prove it exports a Taskset;
    not finding it here does not prove the job's environment lacks it. Raises nothing: an odd id, path or import
    hook (too long a name, a NUL byte, a finder that raises) answers with a reason.
    """
    if taskset_id in BUILTIN_TASKSETS:
        return None
    top = taskset_module_candidates(taskset_id)[1]
    shown = top if len(top) <= 60 else top[:57] + "..."
    parts = top.split(".")
    if not all(p.isidentifier() for p in parts):
        return f"'{shown}' (the id without owner/ and @version) is not a Python module name"
    # A path with a NUL byte cannot exist; os calls would raise ValueError on it rather than find nothing.
    paths = [p for p in extra_paths if p and "\0" not in p]
    try:
        if _in_verifiers_tasksets(parts):
            return None
        if len(parts) > 1:
            return f"a dotted id ('{shown}') resolves only inside verifiers' own taskset package"
        return _top_level_reason(top, paths)
    # Third-party import hooks may raise anything: a best-effort look-up never fails validation.
    except Exception as e:  # noqa: BLE001
        return f"'{shown}' could not be looked up here ({type(e).__name__})"


def _in_verifiers_tasksets(parts: list[str]) -> bool:
    """Whether ``verifiers/v1/tasksets/<parts...>`` is a module or a package, found by path (verifiers located by
    its spec, never imported)."""
    import importlib.util
    from pathlib import Path

    try:
        spec = importlib.util.find_spec("verifiers")
    except (ImportError, ValueError):
        return False
    for root in (spec.submodule_search_locations or []) if spec else []:
        pkg = Path(root, "v1", "tasksets", *parts)
        if pkg.with_suffix(".py").is_file() or (pkg / "__init__.py").is_file():
            return True
    return False


def _top_level_reason(top: str, extra_paths: list[str]) -> str | None:
    import importlib.util
    import sys
    from importlib.machinery import PathFinder

    if top in sys.builtin_module_names:
        return f"'{top}' is a module compiled into Python, not a taskset"
    on_extra = PathFinder.find_spec(top, extra_paths) if extra_paths else None
    if top in sys.stdlib_module_names and (on_extra is None or on_extra.origin is None):
        return f"'{top}' is the standard library's module of that name, not a taskset"
    spec = PathFinder.find_spec(top, [*extra_paths, *sys.path])
    if spec is None or spec.origin is None:
        # Not on any path entry (or only as a namespace portion): the import hooks, e.g. an editable install's
        # finder or a module this process already holds. Top-level names are located, not imported.
        spec = importlib.util.find_spec(top) or spec
    if spec is None:
        return "no such module is importable here"
    if spec.origin is None or spec.origin == "frozen":
        if spec.origin is None:
            return f"'{top}' is a namespace package (a directory without __init__.py), which exports no Taskset"
        return f"'{top}' is a module frozen into Python, not a taskset"
    return None
