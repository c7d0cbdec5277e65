"""srl's built-in verifiers v1 tasksets: ``reverse_text``, ``arith``, ``alphabet_sort`` (multi-turn) and
``code_lookup`` (a tool server) each export exactly one Taskset subclass in ``__all__``; ``common`` holds what they
share (split/seed config, scores)."""

import contextlib
import importlib.util
import sys
from dataclasses import dataclass
from importlib.machinery import PathFinder
from pathlib import Path

# The login node's look-up in the job's own interpreter (preflight reaches envs through this package only).
from toolkit.envs.probe import ProbeError, file_stamp, probe_spec, run_probe

__all__ = [
    "BUILTIN_TASKSETS",
    "ProbeError",
    "TasksetSource",
    "file_stamp",
    "known_taskset_ids",
    "probe_spec",
    "resolve_taskset_source",
    "run_probe",
    "taskset_module_candidates",
    "taskset_unresolved_reason",
]

BUILTIN_TASKSETS: dict[str, str] = {
    "srl-reverse-text": "toolkit.envs.tasksets.reverse_text",
    "srl-alphabet-sort": "toolkit.envs.tasksets.alphabet_sort",
    "srl-arith": "toolkit.envs.tasksets.arith",
    "srl-code-lookup": "toolkit.envs.tasksets.code_lookup",
}
"""Built-in taskset id -> module. An id resolves as verifiers resolves it first (its own taskset package, then an
importable module of that name: an installed environment wins); a built-in serves only an id nothing else
provides (see ``resolve_taskset_source``)."""


@dataclass(frozen=True)
class TasksetSource:
    """Where a taskset id resolves: ``kind`` is ``"verifiers"`` (verifiers' own taskset package), ``"module"`` (an
    importable module: an installed environment or one on the job's PYTHONPATH) or ``"builtin"`` (srl's);
    ``module`` the module imported, ``origin`` its file, ``distribution`` the installed package that provides it
    (``name version``) when known."""

    kind: str
    module: str
    origin: str | None = None
    distribution: str | None = None

    def describe(self) -> str:
        """One line for the dry run and the orchestrator log."""
        where = {"verifiers": "verifiers' taskset package", "module": "module", "builtin": "srl's built-in"}[self.kind]
        text = f"{where} {self.module}"
        if self.distribution:
            text += f" (package {self.distribution})"
        if self.origin and self.kind != "builtin":
            text += f" at {self.origin}"
        return text


def resolve_taskset_source(taskset_id: str, extra_paths: list[str] = ()) -> TasksetSource | None:
    """Where ``taskset_id`` resolves here, in verifiers' order, without importing it: verifiers' own taskset package
    (``verifiers.v1.tasksets.<module>``), else the top-level ``<module>`` on ``extra_paths`` (the job's PYTHONPATH,
    searched first), ``sys.path`` or an import hook (an editable install), else srl's built-in of that id. A
    namespace package (a directory without ``__init__.py``) is not a taskset and does not shadow a built-in.
    None when nothing resolves. Raises nothing."""
    module = taskset_module_candidates(taskset_id)[1]
    parts = module.split(".")
    builtin = BUILTIN_TASKSETS.get(taskset_id)
    if builtin is not None and sys.modules.get(builtin) is not None and sys.modules.get(module) is sys.modules[builtin]:
        # The built-in entered under verifiers' name for it (toolkit.envs.registry.expose_to_verifiers).
        return TasksetSource("builtin", builtin)
    # Third-party import hooks may raise anything: the built-in still answers.
    with contextlib.suppress(Exception):
        if all(p.isidentifier() for p in parts):
            if _in_verifiers_tasksets(parts):
                return TasksetSource("verifiers", f"verifiers.v1.tasksets.{module}")
            paths = [p for p in extra_paths if p and "\0" not in p]
            if len(parts) == 1 and _top_level_reason(module, paths) is None:
                return TasksetSource("module", module, *_origin_and_distribution(module, paths))
    if taskset_id in BUILTIN_TASKSETS:
        return TasksetSource("builtin", BUILTIN_TASKSETS[taskset_id])
    return None


def _origin_and_distribution(module: str, extra_paths: list[str]) -> tuple[str | None, str | None]:
    """The file a top-level ``module`` would load from and the installed distribution providing it, if any."""
    import importlib.metadata

    spec = PathFinder.find_spec(module, [*extra_paths, *sys.path]) or importlib.util.find_spec(module)
    origin = spec.origin if spec is not None else None
    try:
        names = importlib.metadata.packages_distributions().get(module) or []
    except Exception:  # noqa: BLE001 - broken metadata of some other package must not hide the module
        names = []
    dist = None
    if names:
        try:
            dist = f"{names[0]} {importlib.metadata.version(names[0])}"
        except importlib.metadata.PackageNotFoundError:
            dist = names[0]
    return origin, dist


def taskset_module_candidates(taskset_id: str) -> list[str]:
    """The modules a non-built-in ``taskset_id`` resolves to, in verifiers' order (``verifiers.v1.utils.loaders``:
    a hub id ``owner/name@version`` keeps ``name``; ``-`` -> ``_``, lower case; ``verifiers.v1.tasksets.<module>``
    first, then the top-level ``<module>``)."""
    module = taskset_id.rsplit("/", 1)[-1].split("@", 1)[0].replace("-", "_").lower()
    return [f"verifiers.v1.tasksets.{module}", module]


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
        return None  # a built-in always answers, whatever else the id might resolve to
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


def known_taskset_ids(extra_paths: list[str] = ()) -> list[str]:
    """Ids that resolve without anything else installed, for suggesting a close one: srl's built-ins, verifiers'
    own taskset modules and the top-level modules in the ``extra_paths`` directories (the job's PYTHONPATH), the
    latter two with ``_`` spelled ``-``. Found by listing directories; imports nothing and raises nothing."""
    import pkgutil

    ids = set(BUILTIN_TASKSETS)
    roots = []
    with contextlib.suppress(Exception):
        spec = importlib.util.find_spec("verifiers")
        roots = [Path(r, "v1", "tasksets") for r in (spec.submodule_search_locations or [])] if spec else []
    paths = [str(r) for r in roots] + [p for p in extra_paths if p and "\0" not in p]
    with contextlib.suppress(Exception):
        ids.update(m.name.replace("_", "-") for m in pkgutil.iter_modules(paths) if not m.name.startswith("_"))
    return sorted(ids)


def _in_verifiers_tasksets(parts: list[str]) -> bool:
    """Whether ``verifiers/v1/tasksets/<parts...>`` is a module or a package, found by path (verifiers located by
    its spec, never imported)."""
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
