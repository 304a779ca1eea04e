"""uvicorn around the app: blocking for `nano-infer serve`, or on a thread for tests and notebooks.

Both bind the Host allow-list to where they listen (allowed_hosts_for): on localhost only
requests addressed to localhost are answered. lifespan="off": the app has no startup or
shutdown work, the AsyncLLM it serves is started and shut down by its owner.
"""
from __future__ import annotations

import threading
import time

import uvicorn

from ..async_engine import AsyncLLM
from .app import build_app
from .guard import MAX_BODY_BYTES, allowed_hosts_for


def run_server(llm: AsyncLLM, host: str = "127.0.0.1", port: int = 8000, served_model_name: str | None = None,
               log_level: str = "info", api_key: str | None = None, allowed_hosts: tuple[str, ...] = (),
               max_body_bytes: int = MAX_BODY_BYTES) -> None:
    """Serve until Ctrl-C (blocking)."""
    app = build_app(llm, served_model_name, api_key, allowed_hosts_for(host, allowed_hosts), max_body_bytes)
    uvicorn.run(app, host=host, port=port, log_level=log_level, lifespan="off")


class BackgroundServer:
    """uvicorn on a daemon thread with its own event loop, for tests and notebooks.

        server = BackgroundServer(llm)            # port=0: any free port
        openai.OpenAI(base_url=server.url + "/v1", api_key="none")
        server.stop()
    """

    def __init__(self, llm: AsyncLLM, host: str = "127.0.0.1", port: int = 0,
                 served_model_name: str | None = None, log_level: str = "warning", api_key: str | None = None,
                 allowed_hosts: tuple[str, ...] = (), max_body_bytes: int = MAX_BODY_BYTES):
        app = build_app(llm, served_model_name, api_key, allowed_hosts_for(host, allowed_hosts), max_body_bytes)
        config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="off", timeout_graceful_shutdown=2)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="nano_infer-server", daemon=True)
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError(f"the server did not start on {host}:{port} (see the log above)")
            time.sleep(0.01)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://{host}:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
