"""No wait in srl is unbounded, or this table says what ends it.

The scan below finds, in every module of ``toolkit/``, the constructs that can wait forever: ``while True`` loops,
``.wait()`` / ``.join()`` / ``.communicate()`` without a timeout, ``subprocess.run``-style calls without
``timeout=``, a queue's ``.get()`` without one (a call whose result goes straight into ``asyncio.wait_for`` is
bounded by it and not listed). :data:`WAITS` names each of them (module, function, construct) with what bounds it: a
config field, a constant, a deadline in the loop, or the event that always ends it. A new unbounded wait fails
:func:`test_every_wait_is_listed_with_its_bound` until it is listed here, and a listed one that is gone fails
:func:`test_no_stale_entries`. The supervisor's docstring lists the same waits by role, for users.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

WAITS: dict[tuple[str, str, str], str] = {
    ("toolkit/batches.py", "read_batch", "while True"): "its deadline (trainer.batch_timeout_s) and should_stop",
    ("toolkit/envs/runtime.py", "_spawn_once", ".wait()"): "after proc.kill(): the kernel reaps a SIGKILLed child",
    ("toolkit/envs/runtime.py", "_stop_proc", ".wait()"): "after proc.kill() (the SIGTERM wait before it is bounded "
    "by asyncio.wait_for(grace_s))",
    ("toolkit/envs/forkserver.py", "start", ".wait()"): "after proc.kill() of a server that did not start",
    ("toolkit/envs/forkserver.py", "close", ".wait()"): "after proc.kill() (the SIGTERM wait before it is 5 s)",
    ("toolkit/envs/server.py", "_watch_parent", "while True"): "ends the worker once its parent (the orchestrator) "
    "is gone; cancelled at shutdown",
    ("toolkit/envs/server.py", "serve", ".wait()"): "the worker serves until its stop event: SIGTERM, the "
    "orchestrator's shutdown op, or its parent's death (_watch_parent)",
    ("toolkit/inference/client.py", "_post", "while True"): "each attempt waits for the gate with a deadline "
    "(_wait_open) and the request has the client's timeout; "
    "retries end at max_retries or the retry budget",
    ("toolkit/engines/health.py", "read_ready", "while True"): "its timeout (inference.startup_timeout_s + 60 s) "
    "and should_stop",
    ("toolkit/inference/versions.py", "_read_body", "while True"): "ends at the request body's last message; the "
    "ASGI server bounds a client that stops sending",
    ("toolkit/inference/worker_ext.py", "join", ".join()"): "the read-ahead thread reads a fixed list of local "
    "files once and ends",
    ("toolkit/inference/worker_ext.py", "srl_reload_weights", ".join()"): "the same read-ahead thread (join)",
    ("toolkit/launch/control.py", "logs_main", "while True"): "srl logs --follow: ends once the run is not live "
    "(its last round), or on Ctrl-C",
    ("toolkit/launch/slurm.py", "wait", "while True"): "its timeout_s deadline (TimeoutError)",
    ("toolkit/launch/supervisor.py", "_restart", ".wait()"): "after SIGKILL to the dead engine's group",
    ("toolkit/launch/supervisor.py", "stop_all", ".wait()"): "after SIGKILL (TERM_GRACE_S and SRUN_EXIT_WAIT_S "
    "before it)",
    ("toolkit/lease.py", "_loop", "while True"): "daemon thread: ends the role when the lease is lost or its "
    "supervisor died; dies with the process",
    ("toolkit/envs/rollout.py", "wait_excluding_outage", "while True"): "timeout_s (the rollout timeout) "
    "minus inference outages, which the "
    "engine watch bounds",
    ("toolkit/orchestrator/main.py", "_next_group", "while True"): "each get is bounded by QUEUE_POLL_S; the loop "
    "ends on a group or a stop; the progress watchdog "
    "bounds a producer that collects nothing",
    ("toolkit/orchestrator/main.py", "_collect", "while True"): "ends when the batch is full or offered, or a stop; "
    "every group collected is progress for the watchdog",
    ("toolkit/orchestrator/main.py", "_beat", "while True"): "background task, cancelled when the orchestrator ends",
    ("toolkit/orchestrator/policy.py", "wait_for", "while True"): "should_stop; the progress watchdog blames the "
    "trainer it waits on (monitors.stall_timeout_s)",
    ("toolkit/orchestrator/producer.py", "run", "while True"): "background task, cancelled when the run's collection "
    "ends",
    ("toolkit/orchestrator/producer.py", "run", ".wait()"): "wake/started events of the producer's own tasks, "
    "cancelled with it; each rollout has its timeout",
    ("toolkit/envs/rollout.py", "run_rollout", "while True"): "max_turns and max_total_tokens end the "
    "episode; the caller's rollout timeout bounds it",
    ("toolkit/procutil.py", "close", ".wait()"): "after kill() (the wait before it has a timeout)",
    ("toolkit/run/heartbeat.py", "wait_until_finished", "while True"): "the peer's finished phase, or its record "
    "unchanged for silence_s, or should_stop",
    ("toolkit/run/store.py", "_open", "while True"): "its deadline (_LOCK_RETRY_S) for a locked file",
}

_BOUNDING_CALLS = {"wait_for", "wait_excluding_outage"}


def _function_of(node: ast.AST, parents: dict) -> str:
    while node in parents:
        node = parents[node]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return node.name
    return "<module>"


def _bounded_by_caller(node: ast.AST, parents: dict) -> bool:
    up = parents.get(node)
    return isinstance(up, ast.Call) and getattr(up.func, "attr", getattr(up.func, "id", "")) in _BOUNDING_CALLS


def _waits(package: Path = ROOT / "toolkit") -> Counter:
    """(module path from the package's parent, function, construct) -> count, for every wait in ``package``."""
    found: Counter = Counter()
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text())
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

        rel = str(path.relative_to(package.parent))
        for node in ast.walk(tree):
            kind = None
            if isinstance(node, ast.While) and isinstance(node.test, ast.Constant) and node.test.value is True:
                kind = "while True"
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and not _bounded_by_caller(node, parents)
            ):
                name, kws = node.func.attr, {k.arg for k in node.keywords}
                if name in ("wait", "join", "communicate", "get") and not node.args and not kws:
                    kind = f".{name}()"
                elif (
                    isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "subprocess"
                    and name in ("run", "check_output", "check_call", "call")
                    and "timeout" not in kws
                ):
                    kind = f"subprocess.{name} without timeout"
            if kind:
                found[(rel, _function_of(node, parents), kind)] += 1
    return found


def test_every_wait_is_listed_with_its_bound():
    missing = sorted(k for k in _waits() if k not in WAITS)
    assert not missing, (
        "waits without a listed bound (add each to WAITS with what ends it, or bound it):\n"
        + "\n".join(f"  {k}" for k in missing)
    )


def test_no_stale_entries():
    found = _waits()
    stale = sorted(k for k in WAITS if k not in found)
    assert not stale, f"listed waits no longer in the code: {stale}"
    assert all(len(why) > 20 for why in WAITS.values())


def test_the_scan_finds_an_unbounded_wait(tmp_path):
    # The scan itself: a bare Event.wait() and a subprocess.run without timeout are found, a get() inside
    # asyncio.wait_for is not.
    (tmp_path / "toolkit").mkdir()
    (tmp_path / "toolkit" / "probe.py").write_text(
        "import asyncio, subprocess\nasync def f(e, q):\n    await e.wait()\n    await asyncio.wait_for(q.get(), 1)\n"
        "def g():\n    subprocess.run(['true'])\n    while True:\n        break\n"
    )
    found = _waits(tmp_path / "toolkit")
    assert found == Counter(
        {
            ("toolkit/probe.py", "f", ".wait()"): 1,
            ("toolkit/probe.py", "g", "subprocess.run without timeout"): 1,
            ("toolkit/probe.py", "g", "while True"): 1,
        }
    )
