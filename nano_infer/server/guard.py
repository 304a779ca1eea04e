"""The ASGI middleware every request passes before any route: the Host allow-list and the body limit.

Both run before FastAPI reads anything. A body over `max_body_bytes` gets 413
whether it announces its length (Content-Length) or not (chunked: counted as it arrives), so
no client can make the server buffer an unbounded body. A server bound to localhost answers
only requests whose Host header names localhost: a web page the user visits cannot reach it
through DNS rebinding (its requests carry the attacker's host name).
"""
from __future__ import annotations

import json

from starlette.exceptions import HTTPException

from .errors import APIError

MAX_BODY_BYTES = 4 * 1024**2  # a request body larger than this gets 413 before it is read
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")


def allowed_hosts_for(host: str, extra: tuple[str, ...] = ()) -> tuple[str, ...] | None:
    """Bound to localhost: only requests addressed to localhost (and `extra`) are answered, which
    defeats DNS rebinding. Bound to other interfaces: any Host, unless `extra` names some."""
    if host in LOCAL_HOSTS:
        return LOCAL_HOSTS + tuple(extra)
    return tuple(extra) or None


class _Guard:
    """ASGI middleware run before any route: the Host allow-list and the body size limit (413)."""

    def __init__(self, app, allowed_hosts: tuple[str, ...] | None, max_body_bytes: int):
        self.app, self.allowed_hosts, self.max_body_bytes = app, allowed_hosts, max_body_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        if self.allowed_hosts is not None and _hostname(headers.get(b"host", b"").decode("latin-1")) not in self.allowed_hosts:
            return await _send_error(send, APIError(400, "this server answers only requests addressed to "
                                                         f"{', '.join(self.allowed_hosts)} (Host header); "
                                                         "start it with --allowed-host to add a name"))
        length = headers.get(b"content-length", b"0")
        if not length.isdigit() or int(length) > self.max_body_bytes:
            return await _send_error(send, self._too_large())
        received = 0

        async def limited_receive():
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_body_bytes:  # a chunked body that outgrows its limit
                raise HTTPException(413, self._too_large().message)
            return message

        return await self.app(scope, limited_receive, send)

    def _too_large(self) -> APIError:
        return APIError(413, f"the request body is larger than {self.max_body_bytes:,} bytes (--max-request-bytes)")


def _hostname(host: str) -> str:
    if host.startswith("["):  # [::1]:8000
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


async def _send_error(send, error: APIError) -> None:
    """Answer from the middleware itself: no route ran, so no exception handler will."""
    body = json.dumps({"error": error.body()}).encode()
    await send({"type": "http.response.start", "status": error.status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
