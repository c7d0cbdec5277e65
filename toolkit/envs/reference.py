"""SFT data from a taskset's reference answers: the conversation RL would open with, plus the known-correct reply.

Each task becomes one prompt/completion row: ``prompt`` = the messages the policy sees first in an RL episode
(:func:`toolkit.envs.episode.initial_messages`: system prompt, then the task's prompt), ``completion`` = one
assistant message holding the task's reference answer (``data.answer``). SFT on these rows and RL on the same
taskset config therefore see the same prompt token ids.

A task whose data carries ``reference_messages`` (OpenAI chat messages: the known-good episode after the prompt,
with assistant ``tool_calls`` and ``tool`` results) is written as that conversation instead, with a ``tools``
column: the function schemas of the taskset's and the task's tool servers as verifiers' chat program offers them
to the model (``<server name>_<tool name>``, the tool's description and input schema, read from the servers' own
MCP registration in this process; no server is started). SFT then trains the tool call and the answer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from toolkit import fsutil


class NoReferenceAnswer(ValueError):
    """The taskset's tasks carry no reference answer (``data.answer``) to imitate."""


def reference_rows(taskset_cfg: Any) -> list[dict[str, Any]]:
    """One SFT row per selected task of ``taskset_cfg`` (a ``TasksetConfig``): ``{"id", "prompt", "completion"}``.

    Raises NoReferenceAnswer naming the taskset and the first task without a string ``answer``; the taskset's own
    load errors (ValueError, ImportError) pass through.
    """
    from toolkit.envs.episode import initial_messages
    from toolkit.envs.registry import load_selected

    rows = []
    taskset, tasks = load_selected(taskset_cfg)
    schemas: dict[type, list[dict[str, Any]]] = {}  # per task class: every task of a class has the same servers
    for i, task in enumerate(tasks):
        data = task.data
        tid = data.id or i
        row: dict[str, Any] = {"id": str(tid), "prompt": initial_messages(data)}
        episode = getattr(data, "reference_messages", None)
        if isinstance(episode, list) and episode:
            if type(task) not in schemas:
                schemas[type(task)] = tool_schemas(taskset, task)
            row["completion"] = episode
            if schemas[type(task)]:
                row["tools"] = schemas[type(task)]
        else:
            answer = getattr(data, "answer", None)  # a field of the taskset's own TaskData, when it has one
            if not isinstance(answer, str):
                raise NoReferenceAnswer(
                    f"taskset {taskset_cfg.id!r}: task {tid} has no reference answer (data.answer "
                    "must be a string) to write as a completion"
                )
            row["completion"] = [{"role": "assistant", "content": answer}]
        rows.append(row)
    return rows


def registered_tools(taskset: Any, task: Any) -> list[tuple[str, Any, Any]]:
    """The tools verifiers' chat program offers for ``task``, each as ``(chat name, MCP server, MCP tool)``: every
    tool of the taskset's shared servers (``Taskset.toolsets``) and the task's own (``Task.toolsets``), named
    ``<server>_<tool>``, registered on an in-process ``MCPServer`` (nothing is started; ``server.call_tool`` runs
    the tool here). Raises what a ``toolsets()`` or ``register()`` raises."""
    import asyncio

    from mcp.server.mcpserver import MCPServer

    servers = [*type(taskset).toolsets(taskset.config), *type(task).toolsets(taskset.config.task)]
    out: list[tuple[str, Any, Any]] = []
    for server in servers:
        mcp = MCPServer(server.server_name)
        server.register(mcp)
        for tool in asyncio.run(mcp.list_tools()):
            out.append((f"{server.server_name}_{tool.name}" if server.server_name else tool.name, mcp, tool))
    return out


def tool_schemas(taskset: Any, task: Any) -> list[dict[str, Any]]:
    """The OpenAI function schemas verifiers' chat program offers for ``task`` (:func:`registered_tools`), with
    the description and input schema each server registers. Raises what :func:`registered_tools` raises."""
    return [
        {
            "type": "function",
            "function": {"name": name, "description": tool.description or "", "parameters": tool.input_schema},
        }
        for name, _mcp, tool in registered_tools(taskset, task)
    ]


def write_reference_dataset(taskset_cfg: Any, out: Path) -> int:
    """Write :func:`reference_rows` as JSON Lines at ``out`` (atomically). Returns the row count.

    Raises ValueError, writing nothing, when the taskset selects no task (an existing ``out`` is kept: an empty
    file is no dataset ``srl sft`` reads).
    """
    rows = reference_rows(taskset_cfg)
    if not rows:
        raise ValueError(
            f"taskset {taskset_cfg.id!r} (split {taskset_cfg.split!r}) selects no "
            f"task; nothing written to {out} (raise its number of examples)"
        )
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fsutil.atomic_write_text(out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return len(rows)


__all__ = ["NoReferenceAnswer", "reference_rows", "registered_tools", "tool_schemas", "write_reference_dataset"]
