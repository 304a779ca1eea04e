"""Tenants: who sent a request, and how many of theirs are in flight.

The server is shared, and "one client cannot stall another" needs a rule for who "one client"
is. With API keys, a tenant is a key (`--api-key` given several times: one per tenant); without,
it is the peer's address. Per tenant the server counts requests in flight and answers 429 (with
Retry-After) beyond `max_requests_per_tenant`, and with several keys salts its
prefix-cache blocks, so no tenant can hit, or time, another's cached prompt. The engine admits
tenants' requests in turn (AsyncLLM), and the server's workers parse, tokenize and render each tenant's
in turn (FairQueue), so a tenant's 64 bodies of 4 MB take turns among themselves, not with everyone's.
"""
from __future__ import annotations

import contextlib
import hashlib
import secrets
from dataclasses import dataclass

from .errors import APIError


@dataclass(eq=False)
class Tenant:
    name: str  # "key 0", "key 1", ... or the peer's address: never the key itself
    salted: bool  # several keys: its prefix-cache blocks are its own
    in_flight: int = 0

    def cache_salt(self, asked: str | None) -> str | None:
        """The request's cache_salt: the client's own, inside the tenant's when salted. The client's is
        digested, so the tenant's name in front cannot push a salt of the longest length past the limit."""
        if not self.salted:
            return asked
        return f"{self.name}/{hashlib.sha256(asked.encode()).hexdigest() if asked else ''}"


class Tenants:
    def __init__(self, api_keys: tuple[str, ...], max_in_flight: int, retry_after: int):
        self.keys = [k.encode() for k in api_keys]
        self.max_in_flight, self.retry_after = max_in_flight, retry_after
        self.active: dict[str, Tenant] = {}  # tenants with a request in flight

    def identify(self, headers: dict[bytes, bytes], client) -> str:
        """The tenant's name; 401 without a valid key when keys are required. Every key is compared
        in constant time, so the time taken says nothing of which key was close."""
        if not self.keys:
            return client[0] if client else "unknown"
        scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
        matches = [i for i, key in enumerate(self.keys) if secrets.compare_digest(token, key)]
        if scheme.lower() != b"bearer" or not matches:
            raise APIError(401, "missing or wrong API key: send the header 'Authorization: Bearer <key>'",
                           "authentication_error", code="invalid_api_key")
        return f"key {matches[0]}"

    @contextlib.contextmanager
    def admitted(self, name: str):
        """Count one request in flight for the tenant `name` while inside; 429 past the cap."""
        tenant = self.active.get(name) or Tenant(name, salted=len(self.keys) > 1)
        if tenant.in_flight >= self.max_in_flight:
            raise APIError(429, f"{tenant.in_flight} requests of yours are in flight, the most this server takes "
                                f"from one client (--max-requests-per-tenant); retry after one finishes",
                           "rate_limit_error", code="too_many_requests", headers={"Retry-After": str(self.retry_after)})
        self.active[name] = tenant
        tenant.in_flight += 1
        try:
            yield tenant
        finally:
            tenant.in_flight -= 1
            if not tenant.in_flight:
                del self.active[name]
