"""Is a planned command line accepted by the real program it starts? Checked with that program's own parser.

Placement tests replace every component with a probe that accepts any argv, so without this a command line that
vLLM, torchrun, vllm-router or srl's own roles would refuse still passes. :func:`assert_argvs_accepted` runs this
file in a fresh interpreter (vLLM's imports take seconds and configure logging; they stay out of the test process)
and fails naming every refused argv with the parser's message.

What "accepted" means per program (the argv's first word, a path or a bare name):
- ``python -m vllm.entrypoints.openai.api_server ARGS``: the module's own ``main`` is run up to its argument parsing
  (vLLM's ``FlexibleArgumentParser`` filled by ``make_arg_parser``), then ``validate_parsed_serve_args``, as that
  ``main`` does before it starts the server;
- ``python -m MODULE ARGS`` and ``srl ROLE ARGS`` for srl's roles: the real entry point runs up to its argument
  parser (``srl`` through ``toolkit.cli.main``, so an unknown command is refused too), and nothing after it;
- ``torchrun ARGS``: torch's own ``get_args_parser`` and ``config_from_args`` (what torchrun does before it starts
  workers), the c10d rendezvous's ``--rdzv-conf`` keys and timeouts as torch reads them (a key torch does not read
  is refused: torch would ignore it silently), then the worker command it would run (``python -m MODULE ...``),
  checked as above;
- ``vllm-router ARGS``: the router's ``parse_router_args`` (its argparse front end and ``RouterArgs``).
Any other program is refused as unknown, so a new kind of command needs a check here before its tests pass.

Run as a script: a JSON list of argvs on stdin; prints a JSON list of problems (one string each) on stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VLLM_SERVER = "vllm.entrypoints.openai.api_server"
PYTHONS = ("python", "python3", Path(sys.executable).name)


class _Parsed(Exception):
    """Raised by the patched parser once the program's arguments parsed: the program goes no further."""

    def __init__(self, namespace: argparse.Namespace) -> None:
        super().__init__("parsed")
        self.namespace = namespace


@contextlib.contextmanager
def _stop_after_parse():
    """Make the next ``ArgumentParser.parse_args`` parse as usual (refusing with SystemExit 2), then raise _Parsed
    instead of returning, so the program under test never runs past its argument parsing."""
    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        raise _Parsed(original(self, args, namespace))

    argparse.ArgumentParser.parse_args = parse_then_stop  # type: ignore[method-assign]
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_args = original  # type: ignore[method-assign]


def _last_lines(text: str, n: int = 4) -> str:
    """A parser's message without its usage text: its error lines (argparse's; pydantic's field and reason), or
    its last ``n`` lines."""
    lines = [line.strip() for line in text.strip().splitlines()]
    for marker in (": error:", "validation error", "Error"):  # argparse's line; pydantic's; an exception
        found = [i for i, line in enumerate(lines) if marker in line]
        if found:
            return " | ".join(lines[found[-1] :][:n])
    return " | ".join(lines[-n:])


def _run_to_parse(call, argv0: str, args: list[str]) -> tuple[argparse.Namespace | None, str]:
    """Run ``call()`` with ``sys.argv = [argv0, *args]`` until its parser has parsed. Returns (namespace, "") or
    (None, why it was refused: the parser's message, or how the program ended before parsing)."""
    err, out = io.StringIO(), io.StringIO()
    saved = sys.argv
    sys.argv = [argv0, *args]
    try:
        with _stop_after_parse(), contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            result = call()
    except _Parsed as p:
        return p.namespace, ""
    except SystemExit as e:
        return None, f"exit {e.code}: {_last_lines(err.getvalue() or out.getvalue())}"
    except Exception as e:  # noqa: BLE001 - any failure before parsing is the answer
        return None, f"{type(e).__name__}: {e}"
    finally:
        sys.argv = saved
    said = (err.getvalue() or out.getvalue()).strip().splitlines()[:2]
    return None, f"ended (returned {result!r}) without parsing its arguments: {said}"


def _check_python_module(module: str, args: list[str]) -> str:
    """``python -m module args``: the module's ``__main__`` run up to its parser (vLLM: and its serve checks)."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        return f"no module named {module}"
    ns, why = _run_to_parse(lambda: runpy.run_module(module, run_name="__main__", alter_sys=False), module, args)
    if ns is None:
        return why
    if module == VLLM_SERVER:
        from vllm.entrypoints.launchers.cli_args import validate_parsed_serve_args

        try:
            validate_parsed_serve_args(ns)
        except Exception as e:  # noqa: BLE001
            return f"vLLM's serve checks refused it: {type(e).__name__}: {e}"
    return ""


def _check_srl(args: list[str]) -> str:
    """``srl ROLE args`` through srl's own command dispatch, up to the role's parser."""
    from toolkit.cli import main

    ns, why = _run_to_parse(lambda: main(list(args)), "srl", args)
    return "" if ns is not None else why


# The --rdzv-conf keys torch's c10d rendezvous reads (dynamic_rendezvous.create_handler and the c10d backend), plus
# the two torchrun adds itself; torch ignores any other key, so a misspelled one would leave its default in force.
_C10D_RDZV_KEYS = {
    "join_timeout",
    "last_call_timeout",
    "close_timeout",
    "heartbeat_timeout",
    "keep_alive_interval",
    "keep_alive_max_attempt",
    "read_timeout",
    "is_host",
    "store_type",
    "timeout",
    "rank",
}


def _rdzv_conf_problem(config) -> str:
    """The c10d rendezvous settings of torchrun launch config ``config`` as torch parses them ("" when accepted)."""
    if config.rdzv_backend != "c10d":
        return ""
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousTimeout, _get_timeout

    conf = dict(config.rdzv_configs)
    unknown = sorted(set(conf) - _C10D_RDZV_KEYS)
    if unknown:
        return f"--rdzv-conf: torch's c10d rendezvous reads no key {', '.join(unknown)}"
    try:
        params = RendezvousParameters(
            config.rdzv_backend, config.rdzv_endpoint, config.run_id, config.min_nodes, config.max_nodes, **conf
        )
        RendezvousTimeout(*(_get_timeout(params, k) for k in ("join", "last_call", "close", "heartbeat")))
        if (params.get_as_int("read_timeout", 60) or 0) <= 0:
            return "--rdzv-conf: read_timeout must be a positive integer"
    except ValueError as e:
        return f"--rdzv-conf: {e}"
    return ""


def _check_torchrun(args: list[str]) -> str:
    """torchrun's parser and launch config, then the worker command it would start."""
    from torch.distributed.run import config_from_args, get_args_parser

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = get_args_parser().parse_args(args)
        saved_omp = os.environ.get("OMP_NUM_THREADS")
        _config, cmd, cmd_args = config_from_args(ns)
        if saved_omp is None:
            os.environ.pop("OMP_NUM_THREADS", None)  # config_from_args sets it for its workers
    except SystemExit as e:
        return f"torchrun: exit {e.code}: {_last_lines(err.getvalue())}"
    except Exception as e:  # noqa: BLE001
        return f"torchrun: {type(e).__name__}: {e}"
    if why := _rdzv_conf_problem(_config):
        return f"torchrun: {why}"
    if not isinstance(cmd, str) or Path(cmd).name not in PYTHONS or "-m" not in cmd_args:
        return f"torchrun would start {cmd!r} {cmd_args!r}: not a python -m worker this check knows"
    i = cmd_args.index("-m")
    why = _check_python_module(cmd_args[i + 1], list(cmd_args[i + 2 :]))
    return f"torchrun's worker {cmd_args[i + 1]}: {why}" if why else ""


def _check_router(args: list[str]) -> str:
    from vllm_router.launch_router import parse_router_args

    err, saved = io.StringIO(), sys.argv
    sys.argv = ["vllm-router"]  # its parser names itself after argv[0]
    try:
        with contextlib.redirect_stderr(err):
            parse_router_args(list(args))
    except SystemExit as e:
        return f"exit {e.code}: {_last_lines(err.getvalue())}"
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"
    finally:
        sys.argv = saved
    return ""


def argv_problem(argv: list[str]) -> str:
    """Why the real program refuses ``argv``, or "" when it accepts it (see the module docstring)."""
    if not argv:
        return "empty command"
    prog, args = Path(argv[0]).name, list(argv[1:])
    if prog in PYTHONS:
        if len(args) < 2 or args[0] != "-m":
            return "a python command that is not `python -m MODULE ...`"
        return _check_python_module(args[1], args[2:])
    if prog == "srl":
        return _check_srl(args)
    if prog == "torchrun":
        return _check_torchrun(args)
    if prog == "vllm-router":
        return _check_router(args)
    return f"unknown program {prog!r}: add its parser to tests/argv_checks.py"


def argv_problems(argvs: list[list[str]]) -> list[str]:
    """``argv_problems`` of each argv, as "<argv>: <why>" for the refused ones, run in a fresh interpreter.
    Raises AssertionError when the checker itself fails."""
    proc = subprocess.run(
        [sys.executable, __file__],
        input=json.dumps(argvs),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
        check=False,
    )
    if proc.returncode != 0:
        raise AssertionError(f"the argv checker failed (status {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def assert_argvs_accepted(argvs: list[list[str]]) -> None:
    """Fail naming every argv its real program's parser refuses (fresh interpreter; vLLM's takes ~10-15 s)."""
    assert argvs, "no command lines to check"
    problems = argv_problems(argvs)
    assert not problems, "command lines their programs refuse:\n" + "\n".join(problems)


if __name__ == "__main__":
    import logging

    logging.disable(logging.WARNING)  # vLLM's deprecation and platform notes are not answers
    found = []
    for argv in json.loads(sys.stdin.read()):
        why = argv_problem(argv)
        if why:
            found.append(f"{' '.join(argv)}: {why}")
    print(json.dumps(found))
