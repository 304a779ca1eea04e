"""uvicorn around the app: blocking for `nano-infer serve`, or on a thread for tests and notebooks.

Both bind the Host allow-list to where they listen (allowed_hosts_for): on localhost only
requests addressed to localhost are answered. uvicorn gets the connection limits of
ServerLimits (its own keep-alive timeout and graceful-shutdown deadline; connections.py counts the
connections, as uvicorn's limit_concurrency would count the one asking and those being refused too).
lifespan="off": the app has no startup or shutdown work, the AsyncLLM it serves is started and shut
down by its owner; ws="none": it serves no WebSocket, and an upgraded connection would leave the count.

When the server is told to stop (SIGTERM, Ctrl-C, stop()), in-flight requests get
`shutdown_timeout` seconds; then each stream ends cleanly at its next chunk (guard.Drain) and a
client that reads nothing is cut off, so the process exits even with a client that stopped
reading (uvicorn's own deadline, a few seconds later, is only the backstop).

An engine that can no longer serve (its thread ended, a tensor-parallel worker died) would
fail every request for as long as the process lives, while a supervisor saw it running. So a
watchdog stops the server when `AsyncLLM.failure()` says so: /health answers 503 from the
moment it is known, and `run_server` returns False (`nano-infer serve` exits with status 1)
for the supervisor to restart it.
"""
from __future__ import annotations

import logging
import resource
import socket
import threading
import time

import uvicorn

from ..async_engine.async_llm import AsyncLLM
from .app import build_app
from .connections import protocol_class
from .guard import Drain, allowed_hosts_for
from .limits import ServerLimits

log = logging.getLogger("nano_infer.api_server")
WATCH_S = 0.5  # how often the watchdog asks the engine whether it can still serve
BACKSTOP_S = 5  # uvicorn cancels what is left this long after the drain's deadline
SPARE_FDS = 64  # descriptors kept for the model's files, the compile workers' pipes, the log


def _config(app, host: str, port: int, log_level: str, limits: ServerLimits) -> uvicorn.Config:
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="off", http=protocol_class(limits),
                          ws="none", timeout_keep_alive=limits.keep_alive,
                          timeout_graceful_shutdown=limits.shutdown_timeout + BACKSTOP_S)


def _watch(llm: AsyncLLM, server: uvicorn.Server, drain: Drain, limits: ServerLimits, failed: list) -> None:
    """Stop the server if the engine cannot serve; once it is stopping, set the drain's deadline."""
    while not server.should_exit:
        failure = llm.failure()
        if failure is not None:
            log.error("the engine cannot serve (%s): stopping the server", failure)
            failed.append(failure)
            server.should_exit = True
        time.sleep(WATCH_S)
    drain.deadline = time.monotonic() + limits.shutdown_timeout


def _descriptors_for(limits: ServerLimits) -> ServerLimits:
    """Raise the soft limit on open files to the hard one, and keep max_connections under it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    usable = max(1, (hard if hard != resource.RLIM_INFINITY else 2**20) - SPARE_FDS)
    if limits.max_connections > usable:
        log.warning("max_connections lowered from %d to %d, what the open-file limit allows", limits.max_connections, usable)
        limits = ServerLimits(**{**vars(limits), "max_connections": usable})
    return limits


def bound_socket(host: str, port: int) -> socket.socket:
    """The server's socket, bound but not yet listening: `nano-infer serve` takes its port before it loads the
    model, so a busy port is an error at once, not after the load, and nothing the engine starts (the tensor-
    parallel workers' ports) can take it meanwhile. Until the server listens, connections are refused."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart need not wait out TIME_WAIT
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def run_server(llm: AsyncLLM, host: str = "127.0.0.1", port: int = 8000, served_model_name: str | None = None,
               log_level: str = "info", api_key: str | tuple[str, ...] | None = None,
               allowed_hosts: tuple[str, ...] = (), limits: ServerLimits = ServerLimits(),
               sock: socket.socket | None = None, admin_key: str | None = None, metrics_public: bool = False) -> bool:
    """Serve until Ctrl-C or SIGTERM (blocking); False if it stopped because the engine cannot serve.
    `sock`: a socket bound_socket(host, port) took, else the port is bound now."""
    limits, drain = _descriptors_for(limits), Drain()
    sock = sock or bound_socket(host, port)
    app = build_app(llm, served_model_name, api_key, allowed_hosts_for(host, allowed_hosts), limits, drain, admin_key,
                    metrics_public)
    server, failed = uvicorn.Server(_config(app, host, port, log_level, limits)), []
    threading.Thread(target=_watch, args=(llm, server, drain, limits, failed), name="nano_infer-watchdog",
                     daemon=True).start()
    scheme_host = f"[{host}]" if ":" in host else host
    log.info("serving on http://%s:%d (Ctrl+C to quit)", scheme_host, sock.getsockname()[1])
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn raised the signal again after stopping, as uvicorn.run expects
        pass
    return not failed


class BackgroundServer:
    """uvicorn on a daemon thread with its own event loop, for tests and notebooks.

        server = BackgroundServer(llm)            # port=0: any free port
        openai.OpenAI(base_url=server.url + "/v1", api_key="none")
        server.stop()
    """

    def __init__(self, llm: AsyncLLM, host: str = "127.0.0.1", port: int = 0,
                 served_model_name: str | None = None, log_level: str = "warning",
                 api_key: str | tuple[str, ...] | None = None, allowed_hosts: tuple[str, ...] = (),
                 limits: ServerLimits = ServerLimits(shutdown_timeout=2), admin_key: str | None = None,
                 metrics_public: bool = False):
        drain = Drain()
        app = build_app(llm, served_model_name, api_key, allowed_hosts_for(host, allowed_hosts), limits, drain, admin_key,
                        metrics_public)
        self.server, self.failed = uvicorn.Server(_config(app, host, port, log_level, limits)), []
        self.thread = threading.Thread(target=self.server.run, name="nano_infer-server", daemon=True)
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError(f"the server did not start on {host}:{port} (see the log above)")
            time.sleep(0.01)
        threading.Thread(target=_watch, args=(llm, self.server, drain, limits, self.failed), name="nano_infer-watchdog",
                         daemon=True).start()
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://{host}:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
