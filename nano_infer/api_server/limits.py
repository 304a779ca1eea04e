"""ServerLimits: every bound the HTTP side puts on one client, in one place (the README's table).

Each bounds something a hostile client can push on (connections, bodies, slow reading, requests
in flight); the README's limits table says what each one stopped. The engine's own limits (prompt
length, constraints) live beside the engine; these are the transport's.
"""
from __future__ import annotations

from dataclasses import dataclass

MAX_BODY_BYTES = 4 * 1024**2  # a request body larger than this gets 413 before it is read


@dataclass(frozen=True)
class ServerLimits:
    max_body_bytes: int = MAX_BODY_BYTES  # larger bodies get 413, before they are read
    # object keys in one body, and how deep it nests: pydantic reports every unknown key, one at a time;
    # the largest legitimate bodies (a 65,536-character JSON Schema, 2,048 messages) stay well under
    max_body_keys: int = 16_384
    max_body_depth: int = 128
    request_timeout: float = 30.0  # seconds for a request's head and body to arrive, once it has begun
    keep_alive: int = 5  # seconds an idle connection stays open between requests (uvicorn's timeout_keep_alive)
    max_connections: int = 1024  # open connections; beyond, an idle one of the largest holder closes, else 503
    # open connections from one network (an address, an IPv6 /64), so one host cannot take them all; room for a
    # load client's 256 concurrent requests while its finished connections close
    max_connections_per_peer: int = 512
    # the last of max_connections go to networks holding fewer than are left, so hosts that filled the rest
    # leave room for one holding none (connections.py)
    reserved_connections: int = 128
    max_requests_per_tenant: int = 64  # requests in flight per tenant (API key, else address); beyond, they wait
    max_queued_per_tenant: int = 512  # requests of one tenant waiting for one in flight to finish; beyond, 429
    tenant_ipv4_prefix: int = 32  # without keys, a tenant is an address's network: /32 the address alone
    tenant_ipv6_prefix: int = 64  # an IPv6 host usually holds a whole /64
    # body bytes one tenant may send per second, after a burst of one whole body; past it, reading waits
    body_bytes_per_s: int = 32 * 1024**2
    send_timeout: float = 60.0  # a client that takes no bytes of its reply for this long is disconnected
    shutdown_timeout: float = 30.0  # on SIGTERM, seconds in-flight requests get to finish before the exit
    retry_after: int = 1  # seconds, in the Retry-After of a 429

    def __post_init__(self):
        for name, value in vars(self).items():
            if not value > 0:
                raise ValueError(f"ServerLimits.{name}={value!r} must be > 0")
        if self.tenant_ipv4_prefix > 32 or self.tenant_ipv6_prefix > 128:
            raise ValueError(f"ServerLimits.tenant_ipv4_prefix / tenant_ipv6_prefix must be at most 32 / 128 "
                             f"(got {self.tenant_ipv4_prefix} / {self.tenant_ipv6_prefix})")
