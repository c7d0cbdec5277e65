"""The env workers' load of each env, minus the data, in the job's own interpreter: for the login node's preflight.

An env worker resolves its taskset id on the compute node with the job's ``PYTHONPATH`` and refuses a field the
taskset's config class does not declare, a ``select`` it cannot read, a runtime verifiers rejects or srl cannot
provide (a remote sandbox), a harness verifiers cannot load, or a harness other than the chat loop on an srl
built-in. All of that is known before any data is read, so preflight asks the same question here: :func:`run_probe`
starts ``python -m toolkit.envs.probe`` with the job's interpreter and
``PYTHONPATH`` (a fresh process: a taskset module is imported there, never in srl's own process) and reads back one
result per env; srl's own built-ins it checks in process. :func:`check_spec` is the check itself,
built from the worker's own functions (``registry.taskset_config``, ``fidelity``), so the two cannot drift.

Wire: stdin is a JSON list of :func:`probe_spec` dicts; the last stdout line is ``SRL_PROBE_RESULT <JSON list>``
of :func:`check_spec` results in the same order (anything the user's module prints goes to stderr).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from toolkit.envs.fidelity import plain_data, runtime_fields

RESULT_PREFIX = "SRL_PROBE_RESULT "
PROBE_TIMEOUT_S = 300.0
"""Generous: the probe imports verifiers (~6-9 s of CPU measured on a loaded 2-core machine) and the taskset."""


class ProbeError(RuntimeError):
    """The probe process did not answer: it could not start, exited without a result, or ran past its timeout
    (``timed_out``). The message holds the command and the tail of its stderr."""

    def __init__(self, message: str, *, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


def probe_spec(env_cfg: Any) -> dict[str, Any]:
    """What an env worker's load reads of one env config (``EnvConfig``/``EvalEnvConfig``): ``name``, ``eval``,
    ``taskset`` (``id``, ``split``, ``seed``, ``select``, ``extra``) and ``harness`` (``id``, ``runtime``); the
    worker's spec (``toolkit.envs.runtime.env_spec``) is this plus its turn and time limits."""
    ts = env_cfg.taskset
    return {
        "name": env_cfg.env_name,
        # Eval env entries are the ones with a num_examples field (EvalEnvConfig): they must not read train rows.
        "eval": getattr(env_cfg, "num_examples", None) is not None,
        "taskset": {
            "id": ts.id,
            "split": ts.split,
            "seed": ts.seed,
            "select": plain_data(ts.select),
            "extra": plain_data(ts.model_extra or {}),
        },
        "harness": {"id": env_cfg.harness.id, "runtime": runtime_fields(env_cfg.harness.runtime)},
    }


def check_spec(spec: dict[str, Any], extra_paths: Sequence[str] = ()) -> dict[str, Any]:
    """Check one :func:`probe_spec` in this process as the worker would load it, without building the taskset;
    ``extra_paths`` are searched first, as the job's PYTHONPATH (a fresh probe process has it on ``sys.path``).

    Returns ``{"name", "id", "source", "module", "unresolved", "problems"}``: ``source`` is where the id resolved
    (``TasksetSource.describe()``) and ``module`` the module imported, both None with ``unresolved`` (why nothing
    provides the id) when it resolves nowhere; ``problems`` the worker's refusals, each a message. Raises nothing
    for a bad taskset (an import that fails is a problem); imports verifiers and the taskset's module.
    """
    from toolkit.envs import fidelity, registry
    from toolkit.envs.server import taskset_namespace
    from toolkit.envs.tasksets import resolve_taskset_source, taskset_unresolved_reason

    name, tid = spec["name"], spec["taskset"]["id"]
    out: dict[str, Any] = {"name": name, "id": tid, "source": None, "module": None, "unresolved": None, "problems": []}
    source = resolve_taskset_source(tid, list(extra_paths))
    if source is None:
        out["unresolved"] = taskset_unresolved_reason(tid, list(extra_paths)) or "no module provides it"
        return out
    out["source"], out["module"] = source.describe(), source.module
    problems: list[str] = out["problems"]
    ns = taskset_namespace(spec["taskset"])
    try:
        registry.taskset_config(ns, env_name=name, eval_env=bool(spec.get("eval")))
        registry.select_config(ns.select, default_seed=ns.seed or 0)
    except registry.TasksetFieldError as e:
        problems.append(str(e))
    # A module that fails to import, exports no Taskset or rejects select fails the worker the same way.
    except BaseException as e:  # noqa: BLE001 - SystemExit from a module's import is a finding too
        problems.append(f"env '{name}': loading taskset '{tid}' from {source.module} raised {type(e).__name__}: {e}")
        return out
    harness = spec.get("harness") or {}
    runtime = harness.get("runtime") or {"type": "subprocess"}
    # A type this machine cannot provide is preflight's own finding (a container program may exist only on the
    # compute nodes); the fields of a type it can are verifiers' to judge.
    if fidelity.runtime_type_problem(str(runtime.get("type", "subprocess"))) is None:
        try:
            fidelity.build_runtime_config(name, runtime)
        except fidelity.EnvFeatureError as e:
            problems.append(str(e))
    # What the module declares beyond the plain chat loop (an Env class, tools, another harness) runs through
    # verifiers' own rollout in the worker; only a harness verifiers cannot load is refused there.
    hid = str(harness.get("id", "default"))
    problem = fidelity.harness_id_problem(name, hid)
    if problem is not None:
        problems.append(problem)
    return out


def main() -> int:
    """``python -m toolkit.envs.probe``: specs on stdin, one result line on stdout (see the module docstring)."""
    specs = json.loads(sys.stdin.read())
    real_stdout = sys.stdout
    # A taskset module may print on import; only the result line goes to stdout.
    with contextlib.redirect_stdout(sys.stderr):
        results = [check_spec(s) for s in specs]
    real_stdout.write(RESULT_PREFIX + json.dumps(results) + "\n")
    real_stdout.flush()
    return 0


_MEMO: dict[tuple, list[dict[str, Any]]] = {}


def run_probe(
    specs: Sequence[dict[str, Any]],
    *,
    python: str,
    extra_paths: Sequence[str],
    timeout_s: float = PROBE_TIMEOUT_S,
    memo_key: tuple = (),
) -> list[dict[str, Any]]:
    """:func:`check_spec` of each spec as the job's ``python`` with ``PYTHONPATH`` = ``extra_paths`` (empty: this
    process's, which a job that sets none inherits) would load it. Results in ``specs`` order.

    A spec whose id resolves to srl's own built-in (or to nothing) on that path, when ``python`` is this
    interpreter, is checked in this process (the same code either way; verifiers is imported here once instead of once
    per check). Every other spec is checked in a fresh ``python`` from an empty working directory (a worker's ``-m``
    start puts its directory first on ``sys.path``; the run directory holds no modules): the taskset's own module is
    never imported into srl's process. Answers from a per-process memo for the same specs, interpreter, path and
    ``memo_key`` (the caller's stamp of the files involved; a sweep preflights the same envs once per point).
    Raises ProbeError when the process fails to answer within ``timeout_s`` seconds.
    """
    from toolkit.envs.tasksets import resolve_taskset_source

    here = _same_interpreter(python)
    # Without extra paths the job inherits this environment's PYTHONPATH, which this process's sys.path may not
    # show (it was read at start-up; a caller may have set it since).
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    paths = list(extra_paths) or inherited
    # An id that resolves to nothing on that path needs no module imported to say so either.
    local = [
        here and getattr(resolve_taskset_source(s["taskset"]["id"], paths), "kind", None) in ("builtin", None)
        for s in specs
    ]
    results: list[dict[str, Any] | None] = [None] * len(specs)
    for i, spec in enumerate(specs):
        if local[i]:
            key = ("here", tuple(extra_paths), json.dumps(spec, sort_keys=True))
            if key not in _MEMO:
                _MEMO[key] = [_check_builtin(spec, extra_paths)]
            results[i] = _MEMO[key][0]
    rest = [s for s, is_local in zip(specs, local, strict=True) if not is_local]
    if rest:
        pythonpath = os.pathsep.join(extra_paths) if extra_paths else None
        answered = iter(
            _in_subprocess(rest, python=python, pythonpath=pythonpath, timeout_s=timeout_s, memo_key=memo_key)
        )
        results = [r if r is not None else next(answered) for r in results]
    return results  # type: ignore[return-value]


def builtin_cache_dir() -> Path:
    """Where answers for srl's own built-in tasksets are kept between commands: ``$XDG_CACHE_HOME/srl/probe``
    (``~/.cache/srl/probe`` without it)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "srl" / "probe"


def _check_builtin(spec: dict[str, Any], extra_paths: Sequence[str]) -> dict[str, Any]:
    """:func:`check_spec` of a spec that resolves to srl's own code (or to nothing), answered from
    :func:`builtin_cache_dir` when this srl and verifiers answered the same spec before. Why: the check imports
    verifiers (about 5 s of CPU), which every login-node command (a dry run, a submission) would otherwise pay
    for srl's own tasksets, whose answer changes only with srl's or verifiers' code. The key holds the spec, the
    paths, the interpreter, verifiers' version and the stamp of every file of ``toolkit.envs``; a cache that cannot
    be read or written is skipped."""
    import hashlib
    from importlib import metadata

    try:
        vf_version = metadata.version("verifiers")
    except metadata.PackageNotFoundError:
        vf_version = None
    envs_pkg = Path(__file__).resolve().parent
    stamp = file_stamp(sorted(str(p) for p in envs_pkg.rglob("*.py")))
    import shutil

    from toolkit.envs.fidelity import LOCAL_RUNTIME_BINARIES

    # Whether a container program is on PATH decides whether its runtime fields are checked at all.
    programs = {b: shutil.which(b) for b in LOCAL_RUNTIME_BINARIES.values() if b}
    key = json.dumps([spec, list(extra_paths), sys.executable, vf_version, stamp, programs], sort_keys=True)
    path = builtin_cache_dir() / (hashlib.sha256(key.encode()).hexdigest() + ".json")
    with contextlib.suppress(OSError, ValueError):
        cached = json.loads(path.read_text())
        if isinstance(cached, dict) and cached.get("key") == key:
            return cached["result"]
    result = check_spec(spec, extra_paths)
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"key": key, "result": result}))
        os.replace(tmp, path)
    return result


def _same_interpreter(python: str) -> bool:
    with contextlib.suppress(OSError):
        return os.path.samefile(python, sys.executable)
    return False


def _in_subprocess(
    specs: Sequence[dict[str, Any]], *, python: str, pythonpath: str | None, timeout_s: float, memo_key: tuple
) -> list[dict[str, Any]]:
    payload = json.dumps(list(specs), sort_keys=True)
    key = (python, pythonpath, payload, memo_key)
    if key in _MEMO:
        return _MEMO[key]
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    cmd = [python, "-m", "toolkit.envs.probe"]
    with tempfile.TemporaryDirectory(prefix="srl-probe-") as cwd:
        try:
            proc = subprocess.run(
                cmd, input=payload, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout_s, check=False
            )
        except subprocess.TimeoutExpired:
            raise ProbeError(f"{' '.join(cmd)} did not answer within {timeout_s:g} s", timed_out=True) from None
        except OSError as e:
            raise ProbeError(f"{' '.join(cmd)} could not start: {e}") from None
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_PREFIX)]
    if proc.returncode != 0 or not lines:
        tail = proc.stderr.strip().splitlines()[-6:]
        raise ProbeError(
            f"{' '.join(cmd)} exited with status {proc.returncode} without a result"
            + (": " + " | ".join(tail) if tail else "")
        )
    results = json.loads(lines[-1][len(RESULT_PREFIX) :])
    _MEMO[key] = results
    return results


def file_stamp(paths: Sequence[str | None]) -> tuple:
    """``(path, mtime_ns, size)`` of each existing file in ``paths``: a memo key that changes when one is edited."""
    out = []
    for p in paths:
        with contextlib.suppress(OSError, TypeError, ValueError):
            st = Path(p).stat()
            out.append((p, st.st_mtime_ns, st.st_size))
    return tuple(out)


if __name__ == "__main__":
    sys.exit(main())
