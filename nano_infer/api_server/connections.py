"""uvicorn's h11 protocol with the connection limits uvicorn does not have.

uvicorn closes a connection idle between requests (timeout_keep_alive), but it keeps every
connection it accepts until the client closes it, and starts no timer before a connection's
first request: 20,000 connections that sent one byte each ran the server out of file
descriptors. And a cap per address alone lets a few addresses at their caps take every
connection, idle, while everyone else is refused.

So connections are counted per network, grouped as tenants without API keys are (tenants.py: an
address, an IPv6 /64): an IPv6 host holds a whole /64, and a cap per address would let it open as
many connections as it has addresses. A new connection from a network holding `h`, while `n` are
open, is let in when

  - h < max_connections_per_peer, and
  - n < max_connections - reserved_connections, or h < max_connections - n: the last
    `reserved_connections` go only to networks holding fewer than are left, so each network
    takes at most half of what is left of them, and the very last only a network holding none.

Else the oldest idle connection (kept alive between requests, or whose request head has not all
arrived) of the network holding the most among those holding an idle one is closed, if that
network holds more than h + 1, and the new one takes its place; else the new one gets 503 and is
closed at once. So hosts holding idle connections give them up to hosts holding fewer, and no
busy connection is closed: a stream, or a request its tenant's queue holds unread, keeps its own.

What an operator sees: a load client at 256 concurrent requests from one address fits the
defaults with room to spare. A proxy in front is one network, so behind one raise
--max-connections-per-client to --max-connections: the proxy then holds up to max_connections -
reserved_connections (its own clients are told apart by API key, not by connection).

A request whose head and body have not all arrived `request_timeout` seconds after its first
byte, or a connection that sent nothing for as long, is closed (a stream in progress is not: its
request has arrived, nor a request held unread in its tenant's queue, tenants.py).
"""
from __future__ import annotations

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .limits import ServerLimits
from .tenants import Tenants

_BUSY_BODY = b'{"error": {"message": "too many open connections", "type": "service_unavailable", "param": null}}'
_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n"
         b"content-length: %d\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY))


class ConnectionTable:
    """The connections each network holds, which of them are idle, and whether one more may open (the rule
    above). Which are idle is kept up to date by `update`, so a refusal at a full server costs no scan of
    every connection.

    A connection is any object with an `idle` flag and an `evict()` that closes it."""

    def __init__(self, limits: ServerLimits):
        self.limits = limits
        self.networks = Tenants((), limits)  # names a network as a tenant without a key is named
        self.held: dict[str, dict] = {}  # network -> its connections; never empty
        self.idle: dict[str, dict] = {}  # network -> its idle connections, longest idle first; never empty
        self.open = 0

    def network(self, client: tuple[str, int] | None) -> str:
        return self.networks.identify([], client)

    def admit(self, conn, network: str) -> bool:
        """Count `conn` as one of `network`'s if the rule lets it in, evicting an idle connection when
        that makes the room; False: it must be refused."""
        holds = len(self.held.get(network, ()))
        if holds >= self.limits.max_connections_per_peer:
            return False
        if not self._room_for(holds) and not self._evict_for(holds):
            return False
        self.held.setdefault(network, {})[conn] = None
        self.open += 1
        self.update(conn, network)
        return True

    def update(self, conn, network: str) -> None:
        """Note whether `conn` is idle now: called wherever it may have turned (a request arrived, one ended)."""
        if conn not in self.held.get(network, ()):
            return
        idle = self.idle.setdefault(network, {})
        if conn.idle:
            idle.setdefault(conn, None)  # one already idle keeps its place
        else:
            idle.pop(conn, None)
        if not idle:
            del self.idle[network]

    def release(self, conn, network: str) -> None:
        """`conn` closed (or was evicted): no longer counted. Releasing it twice counts once."""
        conns = self.held.get(network, {})
        if conn not in conns:
            return
        del conns[conn]
        self.open -= 1
        if not conns:
            del self.held[network]
        idle = self.idle.get(network, {})
        idle.pop(conn, None)
        if not idle:
            self.idle.pop(network, None)

    def _room_for(self, holds: int) -> bool:
        total, left = self.limits.max_connections, self.limits.max_connections - self.open
        return self.open < total - self.limits.reserved_connections or holds < left

    def _evict_for(self, holds: int) -> bool:
        """Close the longest idle connection of the network holding the most of those that hold an idle one,
        if it holds more than `holds` + 1."""
        network = max(self.idle, key=lambda n: len(self.held[n]), default=None)
        if network is None or len(self.held[network]) <= holds + 1:
            return False
        conn = next(iter(self.idle[network]))
        self.release(conn, network)
        conn.evict()
        return True


def protocol_class(limits: ServerLimits) -> type:
    """The h11 protocol, bound to `limits` and to one server's ConnectionTable (uvicorn builds one protocol per
    connection from `Config.http`)."""
    return type("GuardedH11Protocol", (_GuardedH11,), {"limits": limits, "table": ConnectionTable(limits)})


class _GuardedH11(H11Protocol):
    limits: ServerLimits
    table: ConnectionTable
    _deadline = None
    _network = None  # set once admitted

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        network = self.table.network(self.client)
        if not self.table.admit(self, network):
            self.transport.write(_BUSY)
            self.transport.close()
            return
        self._network = network
        self._arm()

    @property
    def idle(self) -> bool:
        """No request under way: kept alive between requests, or its request head has not all arrived. It turns
        only as a request is parsed (data_received) or the next one awaited (on_response_complete): each tells
        ConnectionTable."""
        return self.conn.our_state is h11.IDLE and self.conn.their_state is h11.IDLE

    def evict(self) -> None:
        self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self._deadline is None and self.conn.their_state is h11.IDLE:  # the next request on a kept-alive connection
            self._arm()
        super().data_received(data)
        self.table.update(self, self._network)

    def on_response_complete(self) -> None:
        self._disarm()
        super().on_response_complete()
        self.table.update(self, self._network)

    def connection_lost(self, exc) -> None:
        self._disarm()
        self.table.release(self, self._network)
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
