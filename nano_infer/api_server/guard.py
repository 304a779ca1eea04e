"""The ASGI middleware every request passes before any route: Host, framing, key, tenant, body size.

All of it runs before a byte of the body is read. A server bound to localhost answers only
requests whose Host header names this machine (localhost, 127.0.0.1, ::1, 0.0.0.0; compared
case-insensitively, and only a well-formed `name[:port]` or `[v6][:port]`): a web page the user
visits cannot reach it through DNS rebinding.
A request with both Content-Length and Transfer-Encoding is refused, as RFC 9112 allows: two
framings are how a request is smuggled past a proxy that reads the other one. On /v1/* the API key
is checked next, then the tenant's requests in flight (tenants.py: past its share a request waits,
its body unread), so a client without a key costs no parsing at all. A body over `max_body_bytes` gets 413 whether it announces its length or
not (chunked: counted as it arrives), and a tenant's bodies are read at most body_bytes_per_s
(after a burst of one whole body). A client that takes no bytes of its reply for
`send_timeout` seconds is cut off: its request is aborted instead of holding memory and a
connection until the server stops. Once the server is stopping (`Drain`) and its shutdown
deadline has passed, a stream still running ends cleanly at its next chunk (an error event, then
`[DONE]`), and a client that does not take that either is cut off a second later; a request whose
response has not begun (a reply not streamed, a stream waiting for its first token, a request
waiting its turn) is cancelled and answered 503 with OpenAI's error body. Requests poll the
deadline one by one, so the first ones cancelled free the engine for a stream still waiting; a stream
whose response would begin after the deadline is answered 503 as well, not started to be cut at once.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from dataclasses import dataclass

from starlette.exceptions import HTTPException

from .errors import APIError
from .limits import ServerLimits
from .tenants import Tenants

log = logging.getLogger("nano_infer.api_server")
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")
TENANT_PATHS = ("/v1/", "/tokenize", "/detokenize")  # a tenant's work: the API key, its share, its pace
_HOST = re.compile(r"(?:\[(?P<v6>[0-9a-f:.]+)\]|(?P<name>[^:\[\]/@\s]+))(?::\d{1,5})?")


# "all interfaces": where `--host 0.0.0.0` listens; as an address to connect to, this machine (vLLM's examples'
# base URL is http://0.0.0.0:8000/v1). No rebinding page carries it as Host: its origin would be this machine.
ALL_INTERFACES = ("0.0.0.0", "::")


def allowed_hosts_for(host: str, extra: tuple[str, ...] = ()) -> tuple[str, ...] | None:
    """Bound to localhost: only requests addressed to localhost or 0.0.0.0 (and `extra`) are answered, which
    defeats DNS rebinding. Bound to other interfaces: any Host, unless `extra` names some; bound to all
    interfaces, 0.0.0.0 is always one."""
    extra = tuple(name.lower() for name in extra)
    if host in LOCAL_HOSTS:
        return LOCAL_HOSTS + ALL_INTERFACES + extra
    if extra and host in ALL_INTERFACES:
        return ALL_INTERFACES + extra
    return extra or None


LAST_SEND_S = 1.0  # past the shutdown deadline, how long the last chunk of a stream may take to go out
DRAIN_POLL_S = 0.25  # how often a request whose response has not begun looks at the shutdown deadline
_SHUTTING_DOWN = ('data: {"error": {"message": "the server is shutting down", "type": "service_unavailable", '
                  '"param": null, "code": null}}\n\ndata: [DONE]\n\n').encode()


@dataclass
class Drain:
    """When in-flight streams must end: set by the runner once the server is told to stop."""

    deadline: float | None = None

    def over(self) -> bool:
        return self.deadline is not None and time.monotonic() > self.deadline


class _SlowReader(Exception):
    """The client took nothing of its reply for send_timeout seconds (or its last chunk at shutdown)."""


class _Ended(Exception):
    """The stream was ended for the shutdown: its response is complete."""


class _TooLate(Exception):
    """A stream would begin after the shutdown deadline: it is answered 503 instead."""


class _Guard:
    """ASGI middleware run before any route (see the module's docstring)."""

    def __init__(self, app, allowed_hosts: tuple[str, ...] | None, limits: ServerLimits, tenants: Tenants, drain: Drain):
        self.app, self.allowed_hosts, self.limits, self.tenants, self.drain = app, allowed_hosts, limits, tenants, drain

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        try:
            self._check_head(headers)
            if not scope["path"].startswith(TENANT_PATHS):
                return await self.app(scope, self._limited(receive), send)
            name = self.tenants.identify(scope["headers"], scope.get("client"))
            started = []  # its response has begun
            return await self._answered_by_deadline(self._admitted(name, scope, receive, send, started), started)
        except APIError as error:
            return await _send_error(send, error)
        except _Ended:
            pass
        except _SlowReader:
            log.warning("a client took nothing of its reply for %g s (send_timeout), or at shutdown: disconnected",
                        self.limits.send_timeout)

    async def _admitted(self, name: str, scope, receive, send, started: list):
        state = scope.setdefault("state", {})
        state["held"] = True  # waiting for a slot, its body unread: not a slow sender (connections.py)
        async with self.tenants.admitted(name) as tenant:
            state["held"], state["tenant"] = False, tenant
            return await self.app(scope, self._limited(receive, name, state), self._timed(send, started))

    async def _answered_by_deadline(self, work, started: list):
        """Run the request `work`. If the shutdown deadline passes before its response has begun (a reply not
        streamed, a stream or a request still waiting its turn), cancel it, which aborts its engine requests,
        and answer 503: uvicorn's own deadline would answer a plain-text 500 a few seconds later."""
        task = asyncio.ensure_future(work)
        try:
            while not (await asyncio.wait({task}, timeout=DRAIN_POLL_S))[0]:
                if self.drain.over() and not started:
                    task.cancel()
                    with contextlib.suppress(BaseException):
                        await task
                    raise _shutting_down()
            return task.result()
        except _TooLate:
            raise _shutting_down() from None
        finally:
            task.cancel()  # this call was cancelled itself (uvicorn's backstop): the request goes with it

    def _check_head(self, headers: dict[bytes, bytes]) -> None:
        if self.allowed_hosts is not None and _hostname(headers.get(b"host", b"").decode("latin-1")) not in self.allowed_hosts:
            raise APIError(400, f"this server answers only requests addressed to {', '.join(self.allowed_hosts)} "
                                f"(Host header); start it with --allowed-host to add a name")
        if b"transfer-encoding" in headers and b"content-length" in headers:
            raise APIError(400, "a request may carry Content-Length or Transfer-Encoding, not both (RFC 9112)")
        length = headers.get(b"content-length", b"0")
        if not length.isdigit() or int(length) > self.limits.max_body_bytes:
            raise self._too_large()

    def _limited(self, receive, tenant: str | None = None, state: dict | None = None):
        """`receive` with the body bounded in size and, for a tenant's request, paced by its body_bytes_per_s
        (reading waits, and TCP makes the client wait too): the bytes and their parsing count against it."""
        received = 0

        async def limited_receive():
            nonlocal received
            message = await receive()
            size = len(message.get("body", b""))
            received += size
            if received > self.limits.max_body_bytes:  # a chunked body that outgrows its limit
                raise HTTPException(413, self._too_large().message)
            wait = self.tenants.charge_bytes(tenant, size) if tenant is not None and size else 0.0
            if wait:
                state["held"] = True  # waiting on its tenant's pace, not a slow sender (connections.py)
                await asyncio.sleep(wait)
                state["held"] = False
            return message
        return limited_receive

    def _timed(self, send, started: list):
        async def timed_send(message):
            if message["type"] == "http.response.start":
                if self.drain.over() and _is_stream(message):
                    raise _TooLate
                started.append(True)
            if self.drain.over() and message["type"] == "http.response.body" and message.get("more_body"):
                await within(send({"type": "http.response.body", "body": _SHUTTING_DOWN, "more_body": False}), LAST_SEND_S)
                raise _Ended
            await within(send(message), self.limits.send_timeout)

        async def within(sending, seconds: float):
            """Await the send; _SlowReader after `seconds`, or a second after the shutdown deadline."""
            task, start = asyncio.ensure_future(sending), time.monotonic()
            try:
                while not (await asyncio.wait({task}, timeout=0.25))[0]:
                    now = time.monotonic()
                    if now - start > seconds or self.drain.over() and now > self.drain.deadline + LAST_SEND_S:
                        raise _SlowReader
                return task.result()
            finally:
                task.cancel()
        return timed_send

    def _too_large(self) -> APIError:
        return APIError(413, f"the request body is larger than {self.limits.max_body_bytes:,} bytes (--max-request-bytes)")


def _is_stream(start: dict) -> bool:
    return any(name == b"content-type" and value.startswith(b"text/event-stream") for name, value in start.get("headers", ()))


def _shutting_down() -> APIError:
    return APIError(503, "the server is shutting down; retry on another instance or once it is back", "service_unavailable")


def _hostname(host: str) -> str | None:
    """The name in a Host header ("LocalHost:8000" -> "localhost", "[::1]:80" -> "::1"); None if malformed."""
    match = _HOST.fullmatch(host.lower())
    return None if match is None else match["v6"] or match["name"]


async def _send_error(send, error: APIError) -> None:
    """Answer from the middleware itself: no route ran, so no exception handler will."""
    body = json.dumps({"error": error.body()}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in error.headers.items()]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
