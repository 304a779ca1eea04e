"""`nano-infer serve`: the OpenAI-compatible server on a port, with the same engine options as `generate`.

    nano-infer serve --model Qwen/Qwen2.5-1.5B-Instruct --port 8000 --max-num-seqs 32
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import signal
import sys
import threading
from multiprocessing import forkserver

from .engine_args import add_engine_args, engine_kwargs
from ..constrained.limits import ConstraintLimits
from ..api_server.protocol import JSON_OBJECT
from ..sampling_params import SamplingParams
from ..api_server.limits import ServerLimits
from ..async_engine.async_llm import TOKENIZE_BACKLOG

DEFAULTS = ServerLimits()


def add_serve_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("serve", help="serve the OpenAI API (/v1/completions, /v1/chat/completions, ...)")
    p.add_argument("--host", default="127.0.0.1", help="0.0.0.0 to accept other machines")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default=None,
                   help="the name clients pass as `model` (default: the hub id, the GGUF file's name, or the model "
                        "folder's name)")
    p.add_argument("--api-key", action="append", default=None, metavar="KEY",
                   help="require 'Authorization: Bearer <key>' on /v1/*; repeat for several tenants, each key one "
                        "(default: $NANO_INFER_API_KEY, comma-separated keys, else none)")
    p.add_argument("--admin-key", default=os.environ.get("NANO_INFER_ADMIN_KEY"), metavar="KEY",
                   help="the key GET /metrics needs ('Authorization: Bearer <key>'), unlike every API key: the "
                        "counters move with every tenant's requests (default: $NANO_INFER_ADMIN_KEY, else none: "
                        "/metrics answers 403)")
    p.add_argument("--metrics-public", action="store_true",
                   help="serve GET /metrics to anyone, without a key (a server whose clients all trust each other)")
    p.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="also answer requests whose Host header is NAME (bound to localhost, only localhost "
                        "names are answered, against DNS rebinding; repeatable)")
    p.add_argument("--max-request-bytes", type=int, default=DEFAULTS.max_body_bytes,
                   help="larger request bodies get 413 (default: %(default)s)")
    p.add_argument("--max-request-bytes-per-second", type=int, default=DEFAULTS.body_bytes_per_s,
                   help="a tenant's request bodies are read at most this fast, after a burst of one whole body; "
                        "faster senders wait (default: %(default)s)")
    p.add_argument("--max-requests-per-tenant", type=int, default=DEFAULTS.max_requests_per_tenant,
                   help="requests in flight per tenant (API key, else client address); more wait (default: %(default)s)")
    p.add_argument("--max-queued-per-tenant", type=int, default=DEFAULTS.max_queued_per_tenant,
                   help="requests of one tenant waiting for one in flight to finish; more get 429 (default: %(default)s)")
    p.add_argument("--max-connections", type=int, default=DEFAULTS.max_connections,
                   help="open connections; past them a new one closes an idle one of the client holding the most, "
                        "else gets 503 (default: %(default)s)")
    p.add_argument("--max-connections-per-client", type=int, default=DEFAULTS.max_connections_per_peer,
                   help="open connections from one client address (IPv6: its /64); behind a proxy, raise it to near "
                        "--max-connections (default: %(default)s)")
    p.add_argument("--reserved-connections", type=int, default=DEFAULTS.reserved_connections,
                   help="the last of --max-connections go only to clients holding fewer than are left, so a client "
                        "holding none finds one (default: %(default)s)")
    p.add_argument("--request-timeout", type=float, default=DEFAULTS.request_timeout,
                   help="seconds a request's head and body may take to arrive (default: %(default)s)")
    p.add_argument("--send-timeout", type=float, default=DEFAULTS.send_timeout,
                   help="a client that reads nothing of its reply for this long is disconnected (default: %(default)s)")
    p.add_argument("--shutdown-timeout", type=float, default=DEFAULTS.shutdown_timeout,
                   help="on SIGTERM or Ctrl-C, seconds in-flight requests get before the exit (default: %(default)s)")
    p.add_argument("--max-tokenize-backlog", type=int, default=TOKENIZE_BACKLOG,
                   help="prompts of one tenant waiting for the tokenizer; past it 429 (default: %(default)s)")
    p.add_argument("--constraint-timeout", type=float, default=ConstraintLimits.timeout,
                   help="seconds a JSON Schema/regex may take to compile before the request gets 400 (default: %(default)s)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    # vLLM's tool-calling flags: here tool_choice "auto" always reads Hermes-style <tool_call> blocks, the one parser
    p.add_argument("--tool-call-parser", choices=["hermes"], default="hermes",
                   help="how tool calls are read from a free reply (hermes: <tool_call>{...}</tool_call> blocks)")
    p.add_argument("--enable-auto-tool-choice", action="store_true",
                   help="accepted: tool_choice 'auto' is always on (a model whose template drops tools needs "
                        "--chat-template chatml_tools)")
    add_engine_args(p)
    p.set_defaults(func=serve)
    return p


def _precompile_json_object(llm) -> None:
    try:
        asyncio.run(llm.precompile(SamplingParams(json_schema=JSON_OBJECT)))
    except Exception:  # noqa: BLE001 - the server stopped first (its pool is closed): nothing left to warm
        pass


def serve(args: argparse.Namespace) -> int:
    from ..async_engine.async_llm import AsyncLLM
    from ..api_server import run_server
    from ..engine.llm_engine import LLMEngine
    from ..api_server.runner import bound_socket

    if args.admin_key is not None and (not args.admin_key or args.admin_key in api_keys(args)):
        print("error: --admin-key must be non-empty and differ from every --api-key", file=sys.stderr)
        return 2
    try:
        sock = bound_socket(args.host, args.port)
    except OSError as e:
        print(f"error: cannot listen on {args.host}:{args.port}: {e.strerror or e} (--port chooses another)", file=sys.stderr)
        return 2
    with _children_ignore_ctrl_c():
        try:
            engine = LLMEngine(args.model, constraint_limits=ConstraintLimits(timeout=args.constraint_timeout),
                               **engine_kwargs(args))
            engine.warm_up()  # the compiled decode steps, before the port answers: no request waits for a compile
            llm = AsyncLLM(engine=engine, tokenize_backlog=args.max_tokenize_backlog)
        except ValueError as e:
            sock.close()
            print(f"error: {e}", file=sys.stderr)
            return 2
        # json_object's regex takes seconds to compile: do it now, so that no request waits for it past its time limit
        threading.Thread(target=_precompile_json_object, args=(llm,), name="nano_infer-warm", daemon=True).start()
    limits = ServerLimits(max_body_bytes=args.max_request_bytes, body_bytes_per_s=args.max_request_bytes_per_second,
                          max_requests_per_tenant=args.max_requests_per_tenant,
                          max_queued_per_tenant=args.max_queued_per_tenant,
                          max_connections=args.max_connections, max_connections_per_peer=args.max_connections_per_client,
                          reserved_connections=args.reserved_connections,
                          request_timeout=args.request_timeout, send_timeout=args.send_timeout,
                          shutdown_timeout=args.shutdown_timeout)
    try:
        with _sigterm_as_ctrl_c():
            served = run_server(llm, args.host, args.port, args.served_model_name, args.log_level, api_keys(args),
                                tuple(args.allowed_host), limits, sock, args.admin_key, args.metrics_public)
    finally:
        llm.shutdown()
    return 0 if served else 1


def api_keys(args: argparse.Namespace) -> tuple[str, ...]:
    """--api-key (repeated), else $NANO_INFER_API_KEY split at commas: one tenant per key."""
    keys = args.api_key if args.api_key is not None else os.environ.get("NANO_INFER_API_KEY", "").split(",")
    return tuple(k.strip() for k in keys if k.strip())


@contextlib.contextmanager
def _children_ignore_ctrl_c():
    """Start the tensor-parallel workers and the constraint compile pool's fork server with Ctrl-C ignored.

    The terminal sends Ctrl-C to the whole process group. A child that gets it while it starts up
    (importing torch) prints a KeyboardInterrupt traceback, and a compile worker it kills is replaced
    while the shutdown unlinks the pool's semaphores (`SemLock._rebuild`: FileNotFoundError). An
    ignored signal stays ignored across fork and exec, and the fork server hands its own setting
    to every worker it forks, so both are started here, and only this process hears Ctrl-C: it
    stops the rest in `llm.shutdown()`."""
    from ..constrained import compile_pool

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        multiprocessing.get_context("forkserver").set_forkserver_preload([compile_pool.__name__])
        forkserver.ensure_running()
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def _sigterm_as_ctrl_c():
    """SIGTERM raises KeyboardInterrupt inside the block, as Ctrl-C does; the previous handler is back after it.

    uvicorn stops serving on either signal, then raises it again under the handler it found, and
    `uvicorn.run` returns on the KeyboardInterrupt. SIGTERM's default handler would instead end the
    process right there, before `llm.shutdown()` closes the constraint compile pool, and the resource
    tracker would report the two semaphores of the pool's channel as leaked."""
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
