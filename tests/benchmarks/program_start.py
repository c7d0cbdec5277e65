"""Benchmark: the CPU a harness program costs per episode, started plainly vs as a fork of a warmed interpreter.

    python tests/benchmarks/program_start.py            # 16 starts each way
    python tests/benchmarks/program_start.py --runs 32

verifiers' ``null`` harness runs its chat program (``CHAT_PROGRAM_SOURCE``: an OpenAI client, an MCP client) as a
new process per episode. The program runs here with ``--help`` (argparse exits after the imports, so the figure is
the start-up a real episode pays before its first request), ``--runs`` times each way, alternating:

- plain: ``python PROGRAM --help``, what the job's interpreter ran before;
- forked: the same argv through :mod:`toolkit.envs.forkserver` (the client, then a fork of the server that
  imported the program's modules once; the server's own start is reported separately, paid once per env worker).

Figure: CPU seconds per start (user + system of the child processes: the client, or the fresh interpreter, plus
the forked program, read from the server's and this process's child rusage) and wall seconds, medians. Ratio =
forked / plain CPU. Goal: <= 0.2 (the imports are most of a start). Exits 1 when the goal is missed.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
GOAL = 0.2


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _server_children_cpu(pid: int) -> float:
    """CPU of the server's reaped children (the forked programs), from /proc (cutime + cstime, in clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    from verifiers.v1.harnesses.utils.launch import CHAT_PROGRAM_SOURCE

    from toolkit.envs.forkserver import ForkServer, program_modules

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=16)
    args = ap.parse_args()
    program = Path(tempfile.mkdtemp(prefix="srl-bench-")) / "chat_program.py"
    program.write_text(CHAT_PROGRAM_SOURCE)
    t0 = time.monotonic()
    server = ForkServer.start(program_modules(CHAT_PROGRAM_SOURCE))
    if server is None:
        print("the fork server did not start", file=sys.stderr)
        return 1
    server_start = time.monotonic() - t0
    plain_cpu, plain_wall, fork_cpu, fork_wall = [], [], [], []
    try:
        for _ in range(args.runs):
            for argv, cpu, wall, forked in (
                ([sys.executable, str(program), "--help"], plain_cpu, plain_wall, False),
                ([*server.command(str(program)), "--help"], fork_cpu, fork_wall, True),
            ):
                before, before_server, t = _children_cpu(), _server_children_cpu(server.proc.pid), time.monotonic()
                r = subprocess.run(argv, capture_output=True, check=False)
                wall.append(time.monotonic() - t)
                if r.returncode != 0 or b"usage:" not in r.stdout:
                    print(f"{argv} failed ({r.returncode}): {r.stderr.decode()[-500:]}", file=sys.stderr)
                    return 1
                used = _children_cpu() - before
                if forked:  # the server reaps the forked program within its poll interval
                    time.sleep(0.1)
                    used += _server_children_cpu(server.proc.pid) - before_server
                cpu.append(used)
    finally:
        server.close()
    plain, forked = statistics.median(plain_cpu), statistics.median(fork_cpu)
    ratio = forked / plain
    print(
        f"chat program start, {args.runs} runs each way, medians "
        f"(server start-up, once per worker: {server_start:.2f} s)"
    )
    print(f"  plain interpreter: {plain:.3f} s CPU, {statistics.median(plain_wall):.3f} s wall")
    print(f"  fork server:       {forked:.3f} s CPU, {statistics.median(fork_wall):.3f} s wall")
    verdict = "PASS" if ratio <= GOAL else "FAIL"
    print(f"ratio forked/plain CPU = {ratio:.3f} (goal <= {GOAL}): {verdict}")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
