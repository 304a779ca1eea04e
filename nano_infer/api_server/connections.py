"""uvicorn's h11 protocol with the two connection limits uvicorn does not have.

uvicorn closes a connection idle between requests (timeout_keep_alive) and answers 503 to a
request beyond limit_concurrency, but it keeps every connection it accepts until the client
closes it, and starts no timer before a connection's first request: 20,000 connections that
sent one byte each ran the server out of file descriptors. Here a connection beyond
`max_connections`, or beyond `max_connections_per_peer` from one address, gets 503 and is closed
at once, and a request whose head and body have not all arrived `request_timeout` seconds after
its first byte is closed (a stream in progress is not: its request has arrived, nor a request held
unread in its tenant's queue, tenants.py).
"""
from __future__ import annotations

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .limits import ServerLimits

_BUSY_BODY = b'{"error": {"message": "too many open connections", "type": "service_unavailable", "param": null}}'
_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n"
         b"content-length: %d\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY))


def protocol_class(limits: ServerLimits) -> type:
    """The h11 protocol, bound to `limits` (uvicorn builds one per connection from `Config.http`)."""
    return type("GuardedH11Protocol", (_GuardedH11,), {"limits": limits})


class _GuardedH11(H11Protocol):
    limits: ServerLimits
    _deadline = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        peer = self.client[0] if self.client else None
        same_peer = sum(1 for c in self.connections if c.client and c.client[0] == peer)
        if len(self.connections) > self.limits.max_connections or same_peer > self.limits.max_connections_per_peer:
            self.transport.write(_BUSY)
            self.transport.close()
            return
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._deadline is None and self.conn.their_state is h11.IDLE:  # the next request on a kept-alive connection
            self._arm()
        super().data_received(data)

    def on_response_complete(self) -> None:
        self._disarm()
        super().on_response_complete()

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.limits.request_timeout, self._request_timed_out)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _request_timed_out(self) -> None:
        self._deadline = None
        cycle = getattr(self, "cycle", None)
        if cycle is not None and cycle.scope["state"].get("held"):  # its tenant's queue holds it, unread
            self._arm()
            return
        if self.conn.their_state in (h11.IDLE, h11.SEND_BODY) and not self.transport.is_closing():
            self.transport.close()  # the request never finished arriving
