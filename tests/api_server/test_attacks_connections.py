"""Round 4 (issue 53): a few addresses holding idle connections up to their caps, and everyone else.

Each attacker address (127.0.0.2, 127.0.0.3, ...) opens connections until the server refuses it, of
three idle kinds: kept alive after a request, nothing sent, a request head begun. The victim, from
127.0.0.1, must still get its streams; its first token is bounded by a control measured in the same run.
"""
import socket
import time

import pytest

from nano_infer.api_server import ServerLimits
from tests.helpers.attacks import MAX_GAP, settle, two_tenants, victim_first_tokens

pytestmark = pytest.mark.slow  # a live server, and hundreds of connections

LIMITS = ServerLimits(max_connections=64, max_connections_per_peer=32, reserved_connections=16, request_timeout=60,
                      keep_alive=60, shutdown_timeout=2)
IDLE_KINDS = {
    "kept alive": b"GET /health HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n",
    "nothing sent": b"",
    "head begun": b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n",
}


@pytest.fixture(scope="module")
def tenants(qwen2_dir):
    with two_tenants(qwen2_dir, LIMITS) as both:
        yield both


class Attacker:
    """Connections from one address, opened until the server refuses one, each left idle as `kind`."""

    def __init__(self, port: int, address: str, kind: str):
        self.port, self.address, self.kind, self.socks = port, address, kind, []

    def fill(self, tries: int = LIMITS.max_connections_per_peer + 4) -> int:
        """Open up to `tries` connections; the number the server kept open."""
        for _ in range(tries):
            sock = socket.socket()
            sock.bind((self.address, 0))
            sock.connect(("127.0.0.1", self.port))
            if IDLE_KINDS[self.kind]:
                sock.sendall(IDLE_KINDS[self.kind])
            self.socks.append(sock)
        time.sleep(0.5)  # refusals and /health's answers arrive
        return self.held()

    def held(self) -> int:
        """The connections the server has not closed, each one's answer read (a kept-alive one has its 200)."""
        open_ = []
        for sock in self.socks:
            if _closed_by_server(sock):
                sock.close()
            else:
                open_.append(sock)
        self.socks = open_
        return len(open_)

    def close(self):
        for sock in self.socks:
            sock.close()


def _closed_by_server(sock) -> bool:
    sock.setblocking(False)
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True
            if data.startswith(b"HTTP/1.1 503"):
                return True
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


def attackers(port: int, addresses: list[str]) -> list[Attacker]:
    kinds = list(IDLE_KINDS)
    return [Attacker(port, address, kinds[i % len(kinds)]) for i, address in enumerate(addresses)]


def test_three_addresses_at_their_caps_leave_the_reserve(tenants):
    """Three addresses open connections until refused, the first (kept alive after a request) up to its cap:
    the third, refused the reserve, takes idle connections of the first, together they hold fewer than
    max_connections, and a victim from a fourth address gets its streams as fast as with no attack."""
    llm, server = tenants
    calm = victim_first_tokens(server.url)
    attack = attackers(server.port, ["127.0.0.2", "127.0.0.3", "127.0.0.4"])
    try:
        first = [a.fill() for a in attack][0]
        held = [a.held() for a in attack]
        slowest = victim_first_tokens(server.url)
    finally:
        for a in attack:
            a.close()
    assert first == LIMITS.max_connections_per_peer and held[0] < first and sum(held) < LIMITS.max_connections, \
        (first, held)
    assert slowest < max(MAX_GAP, 3 * calm), (slowest, calm)
    settle(llm)


def test_every_connection_held_idle_gives_one_up_to_a_new_address(tenants):
    """Nine addresses fill every connection: the victim's connection closes an idle one of the largest holder,
    and a holder of the most, reconnecting, is refused (no one holds more than it does to give one up)."""
    llm, server = tenants
    calm = victim_first_tokens(server.url)
    attack = attackers(server.port, [f"127.0.0.{i}" for i in range(2, 11)])
    try:
        for a in attack:
            a.fill()
        full = sum(a.held() for a in attack)
        slowest = victim_first_tokens(server.url)
        held = [a.held() for a in attack]
        largest = attack[held.index(max(held))]
        again = largest.fill(tries=1)
    finally:
        for a in attack:
            a.close()
    assert full == LIMITS.max_connections and sum(held) == full - 1, (full, held)
    assert again == max(held), (held, again)
    assert slowest < max(MAX_GAP, 3 * calm), (slowest, calm)
    settle(llm)
