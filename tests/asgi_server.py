"""A real HTTP server (uvicorn in a thread) for an ASGI app under test: ``with ServedApp(app) as url: ...``."""

from __future__ import annotations

import threading
import time
from typing import Any

from local_engines import free_port


class ServedApp:
    """Serves ``app`` on a free localhost port from ``__enter__`` (returns the base URL) until ``__exit__``."""

    def __init__(self, app: Any):
        import uvicorn

        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(10)
