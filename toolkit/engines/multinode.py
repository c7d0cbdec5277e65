"""One vLLM engine spread over several nodes (data parallel across nodes): what each node runs.

The placement plan gives an engine that spans ``N`` nodes a single command (``--data-parallel-size N*L``,
``--data-parallel-size-local L``, ``--data-parallel-address <head node>``, ``--data-parallel-rpc-port P``), and the
job step starts it on every node of the engine. Only the first node (the head) may run it as written: it starts the
OpenAI API server and data-parallel ranks ``0..L-1``. Node ``k`` of the engine must instead start *headless*
(engine cores only, no API server) with ranks ``k*L..k*L+L-1``, i.e. ``--headless --data-parallel-start-rank k*L``
(vLLM docs, "Data Parallel Deployment", multi-node). Without this every node would claim rank 0 and start its own
API server, and the engine would never come up. ``--headless`` is an option of the ``vllm serve`` CLI only, so
non-head nodes run ``python -m vllm.entrypoints.cli.main serve`` rather than the API-server module.

Pure functions on argv lists; nothing here imports vllm.
"""

from __future__ import annotations

from collections.abc import Sequence

API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
CLI_MODULE = "vllm.entrypoints.cli.main"


def _flag(argv: Sequence[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv and argv.index(name) + 1 < len(argv) else None


def node_engine_argv(argv: Sequence[str], node_indices: Sequence[int], node: int) -> list[str]:
    """The argv node ``node`` runs for an engine placed on ``node_indices`` (plan node indices, head first).

    Returns ``argv`` unchanged for single-node engines, for the head node, and for commands without
    ``--data-parallel-size-local`` (not a multi-node data-parallel engine). For node ``k > 0`` of the engine returns
    the ``vllm serve`` form with ``--headless --data-parallel-start-rank k*L`` and without the API-server-only
    ``--host``/``--port``/``--middleware`` options. Raises ValueError when ``node`` is not one of the engine's
    nodes or ``--data-parallel-size-local`` is not a positive integer.
    """
    argv = list(argv)
    local = _flag(argv, "--data-parallel-size-local")
    if len(node_indices) < 2 or local is None:
        return argv
    if node not in node_indices:
        raise ValueError(f"node {node} is not one of the engine's nodes {list(node_indices)}")
    k = list(node_indices).index(node)
    if k == 0:
        return argv
    if not local.isdigit() or int(local) < 1:
        raise ValueError(f"--data-parallel-size-local must be a positive integer, got {local!r}")
    if API_SERVER_MODULE not in argv:
        raise ValueError(f"expected an engine command running {API_SERVER_MODULE}, got {argv[:3]}")
    at = argv.index(API_SERVER_MODULE)
    rest: list[str] = []
    args = iter(argv[at + 1 :])
    for a in args:
        if a in ("--host", "--port", "--middleware"):
            next(args, None)  # the API server's own options and their values: a headless node serves no HTTP
        else:
            rest.append(a)
    return [*argv[:at], CLI_MODULE, "serve", *rest, "--headless", "--data-parallel-start-rank", str(k * int(local))]
