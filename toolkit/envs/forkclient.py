"""The client of :mod:`toolkit.envs.forkserver`: ``python -S forkclient.py SOCKET PROGRAM [ARGS ...]``.

Runs ``PROGRAM ARGS`` as a fork of the server's warmed interpreter with this process's environment, working
directory and stdin/stdout/stderr, and ends as the program ends: the same exit status, or killed by the same
signal. SIGTERM, SIGINT, SIGHUP and SIGQUIT are passed on to the program. Standard library only: it runs with
``-S`` (no site-packages) so that it starts in milliseconds.
"""

import json
import os
import signal
import socket
import struct
import sys


def main(argv: list[str]) -> int:
    path, program = argv[0], argv[1:]
    forwarded = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
    # Held until the handlers are in place: the program may already run (and its caller signal this process) while
    # the request is still being sent; a signal arriving then must reach the program, not end this process alone.
    signal.pthread_sigmask(signal.SIG_BLOCK, forwarded)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    payload = json.dumps({"argv": program, "env": dict(os.environ), "cwd": os.getcwd()}).encode()
    socket.send_fds(sock, [struct.pack(">Q", len(payload))], [0, 1, 2])
    sock.sendall(payload)

    def forward(signum: int, _frame: object) -> None:
        try:
            sock.sendall(f"signal {signum}\n".encode())
        except OSError:
            pass

    for sig in forwarded:
        signal.signal(sig, forward)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, forwarded)
    reader = sock.makefile("rb")
    for line in reader:
        word, _, value = line.decode().partition(" ")
        if word == "exit":
            return int(value)
        if word == "killed":
            signum = int(value)
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return 128 + signum
    print("srl forkclient: the fork server went away before the program ended", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
