"""Tenants: who sent a request, and how many of theirs are in flight.

The server is shared, and "one client cannot stall another" needs a rule for who "one client"
is. With API keys, a tenant is a key (`--api-key` given several times: one per tenant); without,
it is the peer's address, grouped by network (an IPv6 host holds a /64). Per tenant the server
holds at most `max_requests_per_tenant` requests in flight; more wait for one of those to finish,
their bodies unread (a load client at 256 concurrent requests is queued, as vLLM queues it, not
refused), and past `max_queued_per_tenant` waiting get 429 with Retry-After. With several keys it salts its
prefix-cache blocks, so no tenant can hit, or time, another's cached prompt. The engine admits
tenants' requests in turn (AsyncLLM), and the server's workers parse, tokenize and render each tenant's
in turn (FairQueue), so a tenant's 64 bodies of 4 MB take turns among themselves, not with everyone's;
and its bodies are read at its own pace (`body_bytes_per_s`, charge_bytes), so the bytes it pushes slow it.
"""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ipaddress
import secrets
import time
from dataclasses import dataclass

from .errors import APIError
from .limits import ServerLimits

BYTES_SWEEP = 1024  # tenants remembered by body pace before those back at a full bucket are forgotten


@dataclass(eq=False)
class Tenant:
    name: str  # "key 0", "key 1", ... or the peer's address (its network): never the key itself
    salted: bool  # several keys: its prefix-cache blocks are its own
    slots: asyncio.Semaphore  # its requests in flight: max_requests_per_tenant, taken in arrival order
    in_flight: int = 0
    waiting: int = 0  # held for a slot, their bodies not read yet

    def cache_salt(self, asked: str | None) -> str | None:
        """The request's cache_salt: the client's own, inside the tenant's when salted. The client's is
        digested, so the tenant's name in front cannot push a salt of the longest length past the limit."""
        if not self.salted:
            return asked
        return f"{self.name}/{hashlib.sha256(asked.encode()).hexdigest() if asked else ''}"


class Tenants:
    def __init__(self, api_keys: tuple[str, ...], limits: ServerLimits):
        self.keys = [k.encode() for k in api_keys]
        self.limits = limits
        self.active: dict[str, Tenant] = {}  # tenants with a request in flight or waiting
        self.bytes: dict[str, tuple[float, float]] = {}  # per tenant: body bytes it may still send at once, when

    def identify(self, headers: list[tuple[bytes, bytes]], client) -> str:
        """The tenant's name; 401 without a valid key when keys are required, 400 for two Authorization
        headers (which one counts would depend on the proxy). The key is what follows `Bearer ` (the scheme
        in any case, then one space), compared exactly; HTTP itself drops whitespace around a header's
        value. Every key is compared in constant time, so the time taken says nothing of which was close."""
        if not self.keys:
            return self._network(client[0]) if client else "unknown"
        given = [value for name, value in headers if name == b"authorization"]
        if len(given) > 1:
            raise APIError(400, f"{len(given)} Authorization headers: send one", code="invalid_api_key")
        scheme, _, token = (given or [b""])[0].partition(b" ")
        matches = [i for i, key in enumerate(self.keys) if secrets.compare_digest(token, key)]
        if scheme.lower() != b"bearer" or not matches:
            raise APIError(401, "missing or wrong API key: send the header 'Authorization: Bearer <key>'",
                           "authentication_error", code="invalid_api_key")
        return f"key {matches[0]}"

    def _network(self, address: str) -> str:
        """Without keys a tenant is an address, and a host holds every address of its network: an IPv6 host
        usually a whole /64. So addresses are grouped by network (tenant_ipv6_prefix, tenant_ipv4_prefix)."""
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return address  # not an IP address (a Unix socket's peer)
        if ip.version == 6 and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        prefix = self.limits.tenant_ipv6_prefix if ip.version == 6 else self.limits.tenant_ipv4_prefix
        if prefix >= ip.max_prefixlen:
            return str(ip)
        return str(ipaddress.ip_network(f"{ip}/{prefix}", strict=False))

    @contextlib.asynccontextmanager
    async def admitted(self, name: str):
        """Hold one of the tenant's max_requests_per_tenant slots while inside. Past them a request waits
        for one, in arrival order, as vLLM queues a load; past max_queued_per_tenant waiting, 429."""
        tenant = self.active.get(name)
        if tenant is None:
            tenant = self.active[name] = Tenant(name, salted=len(self.keys) > 1,
                                                slots=asyncio.Semaphore(self.limits.max_requests_per_tenant))
        if tenant.slots.locked() and tenant.waiting >= self.limits.max_queued_per_tenant:
            raise APIError(429, f"{tenant.in_flight} requests of yours are in flight and {tenant.waiting} wait, the "
                                f"most this server holds for one client (--max-requests-per-tenant, "
                                f"--max-queued-per-tenant); retry after one finishes", "rate_limit_error",
                           code="too_many_requests", headers={"Retry-After": str(self.limits.retry_after)})
        tenant.waiting += 1
        try:
            await tenant.slots.acquire()
            tenant.in_flight += 1
        finally:
            tenant.waiting -= 1
            self._forget_if_idle(tenant)  # a client that left while it waited
        try:
            yield tenant
        finally:
            tenant.in_flight -= 1
            tenant.slots.release()
            self._forget_if_idle(tenant)

    def charge_bytes(self, name: str, size: int) -> float:
        """Count `size` bytes of body against the tenant's body_bytes_per_s (a token bucket holding one whole
        body); the seconds its reading must now wait. 8 loops of 4 MB bodies, refused as they were, still
        slowed another tenant's streams 4-5x when nothing paced them."""
        rate, burst, now = self.limits.body_bytes_per_s, self.limits.max_body_bytes, time.monotonic()
        allowance, stamp = self.bytes.get(name, (burst, now))
        allowance = min(burst, allowance + (now - stamp) * rate) - size
        self.bytes[name] = (allowance, now)
        if len(self.bytes) > BYTES_SWEEP:  # forget the tenants whose bucket has filled up again
            self.bytes = {t: (a, at) for t, (a, at) in self.bytes.items() if a + (now - at) * rate < burst}
        return max(0.0, -allowance / rate)

    def _forget_if_idle(self, tenant: Tenant) -> None:
        if not tenant.in_flight and not tenant.waiting and self.active.get(tenant.name) is tenant:
            del self.active[tenant.name]
