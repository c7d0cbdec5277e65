"""A zero-latency OpenAI-compatible ``/v1/completions`` server for overhead measurements and orchestrator tests.

It answers every completion request at once with the same token ids and logprobs (vLLM's response shape with
``return_token_ids``: ``choices[i].token_ids`` and ``choices[i].logprobs.token_logprobs``, one choice per sample the
request's ``n`` asks for), so a client's rate
against it measures the client side only. Plain asyncio streams with HTTP/1.1 keep-alive: no framework overhead
on the server side. It also answers ``GET /health``.

Run as a process (prints ``READY host:port`` once listening)::

    python tests/loopback_server.py --tokens 71,72,73,2 [--port 0]

or use :class:`LoopbackServer` from tests (starts that process, stops it on exit).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
from pathlib import Path


def _response(token_ids: list[int], logprob: float, n: int = 1) -> bytes:
    body = json.dumps(
        {
            "id": "cmpl-loopback",
            "object": "text_completion",
            "model": "loopback",
            "choices": [
                {
                    "index": i,
                    "text": "",
                    "token_ids": token_ids,
                    "finish_reason": "stop",
                    "logprobs": {
                        "token_logprobs": [logprob] * len(token_ids),
                        "tokens": [],
                        "top_logprobs": None,
                        "text_offset": [],
                    },
                }
                for i in range(n)
            ],
            "usage": {"prompt_tokens": 0, "completion_tokens": len(token_ids), "total_tokens": len(token_ids)},
        }
    ).encode()
    head = f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    return head.encode() + body


async def _serve(host: str, port: int, token_ids: list[int], logprob: float) -> None:
    completions: dict[int, bytes] = {}  # by the request's n (samples of one prompt)
    health = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"
    missing = b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n"
    requests = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal requests
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    if line[:15].lower() == b"content-length:":
                        length = int(line[15:].strip())
                body = await reader.readexactly(length) if length else b""
                path = head.split(b" ", 2)[1]
                requests += 1
                if path.startswith(b"/v1/completions"):
                    n = int(json.loads(body or b"{}").get("n") or 1)
                    if n not in completions:
                        completions[n] = _response(token_ids, logprob, n)
                writer.write(
                    completions[n]
                    if path.startswith(b"/v1/completions")
                    else health
                    if path.startswith(b"/health")
                    else missing
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, host, port, backlog=1024)
    sock = server.sockets[0].getsockname()
    print(f"READY {sock[0]}:{sock[1]}", flush=True)
    async with server:
        await server.serve_forever()


class LoopbackServer:
    """Start the server as a child process; ``url`` is its base URL. Stops it (SIGTERM, then SIGKILL) on exit."""

    def __init__(self, token_ids: list[int], *, logprob: float = -0.5, host: str = "127.0.0.1") -> None:
        self.token_ids, self.logprob, self.host = token_ids, logprob, host
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def __enter__(self) -> LoopbackServer:  # noqa: PYI034
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__).absolute()),
                "--host",
                self.host,
                "--port",
                "0",
                "--tokens",
                ",".join(map(str, self.token_ids)),
                "--logprob",
                str(self.logprob),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        line = self.proc.stdout.readline().strip()
        if not line.startswith("READY "):
            self.__exit__()
            raise RuntimeError(f"loopback server did not start: {line!r}")
        self.url = f"http://{line.split()[1]}"
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--tokens", required=True, help="comma-separated token ids of every completion")
    p.add_argument("--logprob", type=float, default=-0.5)
    a = p.parse_args()
    asyncio.run(_serve(a.host, a.port, [int(t) for t in a.tokens.split(",")], a.logprob))


if __name__ == "__main__":
    main()
