"""A fork server for harness programs: each episode's program starts as a fork of an interpreter that has already
imported the program's modules, instead of a fresh interpreter that imports them again.

verifiers runs a harness program (the ``null`` harness's chat program: an OpenAI client, an MCP client) as a new
process per episode. Its imports cost about a second of CPU, more than the episode itself for a small model: at 32
episodes per step that is most of a CPU-bound step. Here the env worker starts one server per program
(:func:`ForkServer.start`), which imports the program's modules once and listens on a Unix socket. The runtime runs
``python -S forkclient.py SOCKET PROGRAM ARGS...`` instead of ``python PROGRAM ARGS...``: the client (standard
library only, no site-packages, a few milliseconds) passes its argv, environment, working directory and its
stdin/stdout/stderr descriptors to the server, which forks; the child takes them over and runs the program as
``__main__`` (``runpy``). The client waits and exits with the program's status (a program killed by a signal
kills the client with the same signal), forwards SIGTERM, SIGINT, SIGHUP and SIGQUIT to the program, and when the
client is killed (verifiers SIGKILLs the process group of a program that outlived its stage) the server kills the
program's process group. What runs is the program's own text with the runtime's argv, environment and directory;
only process creation differs. ``PYTHONPATH`` in the program's environment is applied to ``sys.path`` as a fresh
interpreter would.

Protocol on the socket: client -> server: 8-byte big-endian payload length sent with 3 descriptors
(``SCM_RIGHTS``: 0, 1, 2), then the JSON payload ``{"argv", "env", "cwd"}``, then zero or more lines
``signal N``. Server -> client: ``pid N`` once forked, then ``exit N`` or ``killed N`` (the signal).

The server also learns the modules a program imports lazily, after its own imports (openai's resource and type
modules on first use of a client, httpx's transport backend when a client is made): measured in a code-lookup RL
step, each forked chat program still spent about 14 s (32 at once on 2 cores) importing those. When a child ends it
writes the names and files of the modules it imported to ``learn-<pid>`` beside the socket; the server imports each
one it would load from the same file (so a module the program found on its own ``PYTHONPATH`` is never taken from
the server's path instead), and later forks start with them.

The server is single-threaded (forking a threaded process can copy a held lock) and polls for exited children;
it exits when the process that started it exits. It stops learning if a learned import ever starts a thread.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.util
import json
import os
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

CLIENT = Path(__file__).with_name("forkclient.py")
"""The client script, run by path with ``python -S`` (it imports the standard library only)."""

_POLL_S = 0.02
_HEADER = struct.Struct(">Q")


def program_modules(source: str) -> list[str]:
    """The absolute module names ``source`` (a Python program) imports, outside ``if TYPE_CHECKING:`` blocks, in
    first-seen order. Raises SyntaxError for a program that does not parse."""
    found: dict[str, None] = {}

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for alt in child.orelse:
                    visit_node(alt)
                continue
            visit_node(child)

    def visit_node(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            found.update((a.name, None) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found[node.module] = None
        visit(node)

    visit(ast.parse(source))
    return list(found)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


class ForkServer:
    """A running fork server (a child process of this one) for programs that import ``modules``.

    :meth:`start` returns None when the server cannot start here (then programs run as plain processes).
    :meth:`command` is the argv that runs ``program`` through it; :meth:`close` stops it.
    """

    def __init__(self, proc: subprocess.Popen, socket_path: Path) -> None:
        self.proc = proc
        self.socket_path = socket_path

    @classmethod
    def start(cls, modules: list[str], *, timeout_s: float = 120.0) -> ForkServer | None:
        """Start a server that preloads ``modules``; wait up to ``timeout_s`` seconds until it listens. None when
        it did not come up (its stderr goes to this process's stderr)."""
        tmp = Path(tempfile.mkdtemp(prefix="srl-fork-"))
        path = tmp / "s"
        proc = subprocess.Popen(
            [sys.executable, "-m", "toolkit.envs.forkserver", str(path), str(os.getpid()), *modules],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            start_new_session=True,  # a signal to the worker's group is the worker's to handle
        )
        ready = threading.Event()

        def wait_ready() -> None:
            line = proc.stdout.readline() if proc.stdout else b""
            if line.strip() == b"ready":
                ready.set()

        threading.Thread(target=wait_ready, daemon=True).start()
        if not ready.wait(timeout_s):
            proc.kill()
            proc.wait()
            return None
        return cls(proc, path)

    def command(self, program: str) -> list[str]:
        """The argv that runs ``python program`` through this server."""
        return [sys.executable, "-S", str(CLIENT), str(self.socket_path), program]

    def close(self) -> None:
        """Stop the server (programs it started keep running until their clients end)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(5)
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.socket_path.parent, ignore_errors=True)  # the socket and any unread learn-<pid> file


# --- the server process --------------------------------------------------------------------------------------


class _Conn:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""
        self.fds: list[int] = []
        self.need: int | None = None
        self.pid: int | None = None


def _serve(path: str, parent: int, modules: list[str]) -> int:
    for name in modules:
        with contextlib.suppress(Exception):  # the program raises its own ImportError when it runs
            importlib.import_module(name)
    if threading.active_count() != 1:
        print(f"srl forkserver: preloading started threads ({threading.enumerate()}); not serving", file=sys.stderr)
        return 1
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    listener.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    conns: dict[int, _Conn] = {}  # by socket fd
    children: dict[int, _Conn] = {}  # by child pid
    learn = _Learner(Path(path).parent)
    print("ready", flush=True)
    while os.getppid() == parent:
        for key, _ in sel.select(_POLL_S):
            if key.fileobj is listener:
                with contextlib.suppress(BlockingIOError):
                    sock, _ = listener.accept()
                    sock.setblocking(True)
                    conns[sock.fileno()] = _Conn(sock)
                    sel.register(sock, selectors.EVENT_READ)
                continue
            conn = conns[key.fileobj.fileno()]
            try:
                alive = _on_readable(conn, listener, conns, children, learn.folder)
            except OSError:  # the client went away mid-exchange (reset, or gone before its "pid" line was sent)
                alive = False
            if not alive:
                sel.unregister(conn.sock)
                del conns[conn.sock.fileno()]
                if conn.pid is not None:  # the client is gone: so is its program
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(conn.pid, signal.SIGKILL)
                conn.sock.close()
        for pid in _reap(children):
            learn.take(pid)
    for pid in children:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    return 0


def _on_readable(conn: _Conn, listener: socket.socket, conns: dict, children: dict, folder: Path) -> bool:
    """Read what the client sent; False when the connection is over."""
    if conn.need is None:
        data, fds, _, _ = socket.recv_fds(conn.sock, _HEADER.size, 3)
        if not data:
            return False
        conn.fds = list(fds)
        conn.need = _HEADER.unpack(data)[0]
        return True
    chunk = conn.sock.recv(65536)
    if not chunk:
        return False
    conn.buf += chunk
    if conn.pid is None and len(conn.buf) >= conn.need:
        payload, conn.buf = json.loads(conn.buf[: conn.need]), conn.buf[conn.need :]
        conn.pid = _fork(payload, conn, listener, conns, folder)
        for fd in conn.fds:
            os.close(fd)
        children[conn.pid] = conn
        conn.sock.sendall(f"pid {conn.pid}\n".encode())
    while conn.pid is not None and b"\n" in conn.buf:
        line, conn.buf = conn.buf.split(b"\n", 1)
        if line.startswith(b"signal "):
            with contextlib.suppress(ProcessLookupError, PermissionError, ValueError):
                os.killpg(conn.pid, int(line.split()[1]))
    return True


def _reap(children: dict[int, _Conn]) -> list[int]:
    """Collect the children that exited and tell their clients how; returns their pids."""
    ended: list[int] = []
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        ended.append(pid)
        conn = children.pop(pid, None)
        if conn is None:
            continue
        line = (
            f"killed {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exit {os.waitstatus_to_exitcode(status)}"
        )
        with contextlib.suppress(OSError):
            conn.sock.sendall(line.encode() + b"\n")
        conn.pid = None
    return ended


class _Learner:
    """The server's side of learning lazy imports (module docstring): reads ``learn-<pid>`` files, imports."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.on = True
        self.tried: set[tuple[str, str]] = set()  # (name, file) pairs already imported or left out

    def take(self, pid: int) -> None:
        report = self.folder / f"learn-{pid}"
        try:
            lines = report.read_text().splitlines()
        except OSError:
            return  # killed before it wrote one
        finally:
            report.unlink(missing_ok=True)
        if not self.on:
            return
        # Parents before their submodules; a name whose spec resolves elsewhere (or not at all) here is left out.
        # Nobody reads the server's stdout after "ready": a module that prints while imported writes to stderr.
        with contextlib.redirect_stdout(sys.stderr):
            for name, _, origin in sorted((ln.partition("\t") for ln in lines), key=lambda t: t[0].count(".")):
                if name in sys.modules or (name, origin) in self.tried:
                    continue  # every later child reports what the server could not take: look each up once
                self.tried.add((name, origin))
                with contextlib.suppress(Exception):
                    spec = importlib.util.find_spec(name)
                    if spec is not None and spec.origin == origin:
                        importlib.import_module(name)
        if threading.active_count() != 1:
            self.on = False
            print(
                f"srl forkserver: a learned import started a thread ({threading.enumerate()}); no more learning",
                file=sys.stderr,
                flush=True,
            )


def _report_imports(folder: Path, before: set[str]) -> None:
    """In a child about to exit: write the modules it imported since the fork, with their files, for the server."""
    lines = []
    for name, mod in list(sys.modules.items()):
        origin = getattr(getattr(mod, "__spec__", None), "origin", None)
        if name not in before and name != "__main__" and isinstance(origin, str) and "\t" not in name + origin:
            lines.append(f"{name}\t{origin}")
    tmp = folder / f".learn-{os.getpid()}"
    tmp.write_text("\n".join(lines))
    tmp.rename(folder / f"learn-{os.getpid()}")


def _fork(payload: dict, conn: _Conn, listener: socket.socket, conns: dict, folder: Path) -> int:
    pid = os.fork()
    if pid:
        with contextlib.suppress(OSError):  # both sides set the group, so a signal sent at once reaches it
            os.setpgid(pid, pid)
        return pid
    code = 1
    before = set(sys.modules)
    try:
        os.setpgid(0, 0)
        listener.close()
        for other in conns.values():
            other.sock.close()
        for target, fd in enumerate(conn.fds):
            os.dup2(fd, target)
        for fd in conn.fds:
            if fd > 2:
                os.close(fd)
        code = _run_program(payload)
    except BaseException:  # noqa: BLE001 - whatever happened, the child must end here, not return into the server
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        with contextlib.suppress(Exception):
            _report_imports(folder, before)
        os._exit(code)


def _run_program(payload: dict) -> int:
    import atexit
    import runpy

    argv, env, cwd = payload["argv"], payload["env"], payload["cwd"]
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    program = os.path.abspath(argv[0])
    # As a fresh interpreter: the program's directory first, then PYTHONPATH, then the interpreter's own paths.
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    base = [p for p in sys.path[1:] if p not in extra]
    sys.path[:] = [os.path.dirname(program), *extra, *base]
    sys.argv = list(argv)
    code = 0
    try:
        runpy.run_path(program, run_name="__main__")
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        code = 128 + signal.SIGINT
    finally:
        atexit._run_exitfuncs()
    return code


def main(argv: list[str]) -> int:
    """``python -m toolkit.envs.forkserver SOCKET PARENT_PID [MODULE ...]``."""
    path, parent, modules = argv[0], int(argv[1]), argv[2:]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    return _serve(path, parent, modules)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
