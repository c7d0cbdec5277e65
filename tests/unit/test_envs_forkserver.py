"""The harness-program fork server: a program run through it behaves as the same program run by a fresh interpreter
(argv, environment, directory, stdio, exit status, signals), and a client that is killed takes its program along."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from toolkit.envs.forkserver import ForkServer, program_modules

PROGRAM = textwrap.dedent(
    """
    import json, os, sys, time
    import helper_mod
    if sys.argv[1:2] == ["wait"]:
        print(os.getpid(), flush=True)
        time.sleep(60)
    data = sys.stdin.read()
    sys.stderr.write("to stderr\\n")
    print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "x": os.environ.get("X"), "stdin": data,
                      "helper": helper_mod.VALUE, "main": __name__, "file": os.path.basename(__file__)}))
    sys.exit(int(os.environ.get("CODE", "0")))
    """
)


@pytest.fixture(scope="module")
def server():
    fs = ForkServer.start(["json"])
    assert fs is not None
    yield fs
    fs.close()


def _program_with_lib(tmp_path, source: str, module: str, module_text: str):
    """Write ``source`` as ``prog.py`` and ``module`` into ``lib/`` (the program's PYTHONPATH); (path, lib)."""
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / f"{module}.py").write_text(module_text)
    path = tmp_path / "prog.py"
    path.write_text(source)
    return path, lib


@pytest.fixture
def program(tmp_path):
    return _program_with_lib(tmp_path, PROGRAM, "helper_mod", "VALUE = 'from PYTHONPATH'\n")


def _env(lib, **extra):
    return {**os.environ, "PYTHONPATH": str(lib), **extra}


def test_the_program_sees_what_a_fresh_interpreter_would(server, program, tmp_path):
    path, lib = program
    work = tmp_path / "work"
    work.mkdir()
    cmd = [*server.command(str(path)), "a", "b c"]
    via = subprocess.run(cmd, check=False, input=b"in", capture_output=True, env=_env(lib, X="42", CODE="3"), cwd=work)
    plain = subprocess.run(
        [sys.executable, str(path), "a", "b c"],
        check=False,
        input=b"in",
        capture_output=True,
        env=_env(lib, X="42", CODE="3"),
        cwd=work,
    )
    assert via.returncode == plain.returncode == 3
    assert via.stdout == plain.stdout
    assert b'"helper": "from PYTHONPATH"' in via.stdout and b'"main": "__main__"' in via.stdout
    assert via.stderr == plain.stderr == b"to stderr\n"


def test_a_signal_to_the_client_reaches_the_program_and_the_client_ends_the_same_way(server, program):
    path, lib = program
    p = subprocess.Popen([*server.command(str(path)), "wait"], stdout=subprocess.PIPE, env=_env(lib))
    child = int(p.stdout.readline())
    p.send_signal(signal.SIGTERM)
    assert p.wait(30) == -signal.SIGTERM
    _gone(child)


def test_a_killed_client_takes_its_program_along(server, program):
    path, lib = program
    p = subprocess.Popen([*server.command(str(path)), "wait"], stdout=subprocess.PIPE, env=_env(lib))
    child = int(p.stdout.readline())
    p.kill()
    p.wait(30)
    _gone(child)


def test_a_client_gone_before_its_pid_line_takes_its_program_along_and_the_server_keeps_serving(server, program):
    """A client killed right after sending its request (before the server's ``pid`` line): the server's reply hits a
    closed socket. That once killed the server (BrokenPipeError), leaving the program running and every later
    episode without a server. Here the request is sent by hand and the socket closed at once."""
    import json
    import socket
    import struct

    path, lib = program
    out_r, out_w = os.pipe()
    payload = json.dumps({"argv": [str(path), "wait"], "env": _env(lib), "cwd": os.getcwd()}).encode()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(server.socket_path))
    socket.send_fds(sock, [struct.pack(">Q", len(payload))], [0, out_w, 2])
    sock.sendall(payload)
    sock.close()
    os.close(out_w)
    with os.fdopen(out_r) as out:
        line = out.readline()  # end of file: every holder of the pipe closed it, the program too (killed early)
    if line:
        _gone(int(line))
    again = subprocess.run(server.command(str(path)), check=False, input=b"", capture_output=True, env=_env(lib))
    assert again.returncode == 0 and b'"main": "__main__"' in again.stdout


def test_program_modules_skips_type_checking_blocks():
    source = textwrap.dedent(
        """
        import os, json
        from typing import TYPE_CHECKING
        from . import sibling
        if TYPE_CHECKING:
            import heavy_only_for_types
        else:
            import runtime_only
        def f():
            from http import client
        """
    )
    assert program_modules(source) == ["os", "json", "typing", "runtime_only", "http"]


def _gone(pid: int, timeout_s: float = 30.0) -> None:
    """Wait until ``pid`` no longer exists (the server reaps it); fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise AssertionError(f"program {pid} still running {timeout_s} s after its client ended")


def test_one_server_per_program_in_a_process_across_event_loops_and_a_switch_to_turn_it_off(monkeypatch):
    import asyncio

    from toolkit.envs import programs

    script = b"import json\nprint(json.dumps(1))\n"
    monkeypatch.setattr(programs, "_FORK_SERVERS", {})
    first = asyncio.run(programs._fork_server(script))
    try:
        assert first is not None and asyncio.run(programs._fork_server(script)) is first
        monkeypatch.setenv("SRL_FORK_PROGRAMS", "0")
        assert asyncio.run(programs._fork_server(b"print(2)\n")) is None
    finally:
        first.close()


LAZY = textwrap.dedent(
    """
    import json, sys
    names = ("xml.dom.minidom", "srl_lazy_helper")
    had = [n for n in names if n in sys.modules]
    def work():
        import xml.dom.minidom, srl_lazy_helper  # imported late, as openai's resources are on first use
    work()
    print(json.dumps(had))
    """
)


def test_modules_a_program_imports_late_are_preloaded_for_the_next_fork_but_never_its_own_path(tmp_path):
    # The server learns xml.dom.minidom (the standard library, the same file from its own path) from the first run;
    # srl_lazy_helper comes from the program's PYTHONPATH, which the server does not search, so it is never learned.
    path, lib = _program_with_lib(tmp_path, LAZY, "srl_lazy_helper", "VALUE = 1\n")
    fs = ForkServer.start(["json"])
    assert fs is not None
    try:
        runs = [
            subprocess.run(
                fs.command(str(path)), check=True, capture_output=True, env=_env(lib), timeout=60
            ).stdout.strip()
            for _ in range(3)
        ]
        # The server reads a child's report before it serves the next client, so after the third run only the
        # third's report may be left: reports do not pile up over an RL run's thousands of episodes.
        reports = [p.name for p in fs.socket_path.parent.iterdir() if p.name.startswith("learn-")]
    finally:
        fs.close()
    assert runs == [b"[]", b'["xml.dom.minidom"]', b'["xml.dom.minidom"]'], runs
    assert len(reports) <= 1, reports
    assert not fs.socket_path.parent.exists()
