"""The guard's rules without an engine: the shutdown deadline in the middleware, with routes that reach it at a
chosen moment, and which connection is let in (connections.ConnectionTable), with connections that are plain objects."""
import asyncio
import time
from dataclasses import dataclass

import httpx
from hypothesis import given, settings, strategies as st
from starlette.applications import Starlette
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from nano_infer.api_server.connections import ConnectionTable
from nano_infer.api_server.guard import Drain, _Guard
from nano_infer.api_server.limits import ServerLimits
from nano_infer.api_server.tenants import Tenants


def guarded_app(drain: Drain) -> Starlette:
    """Each route's response begins once the deadline has passed: its work ended just too late."""
    async def events():
        yield b"data: {}\n\n"
        yield b"data: [DONE]\n\n"

    async def stream(request):
        drain.deadline = time.monotonic() - 1
        return StreamingResponse(events(), media_type="text/event-stream")

    async def reply(request):
        drain.deadline = time.monotonic() - 1
        return JSONResponse({"done": True})

    limits = ServerLimits()
    app = Starlette(routes=[Route("/v1/stream", stream, methods=["POST"]), Route("/v1/reply", reply, methods=["POST"])])
    app.add_middleware(_Guard, allowed_hosts=None, limits=limits, tenants=Tenants((), limits), drain=drain)
    return app


def post(app, path: str) -> httpx.Response:
    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
            return await client.post(path, json={})
    return asyncio.run(go())


def test_a_stream_that_would_begin_after_the_deadline_is_answered_503():
    r = post(guarded_app(Drain()), "/v1/stream")
    assert r.status_code == 503 and r.json()["error"]["type"] == "service_unavailable", r.text


def test_a_reply_ready_after_the_deadline_is_still_sent():
    r = post(guarded_app(Drain()), "/v1/reply")
    assert r.status_code == 200 and r.json() == {"done": True}, r.text


@dataclass(eq=False)
class Conn:
    idle: bool = False
    since: int = 0  # the step it last turned idle at
    evicted: bool = False

    def evict(self):
        self.evicted = True


def fill(table: ConnectionTable, network: str, idle: bool = False, tries: int = 10_000) -> list[Conn]:
    """Open connections from `network` until one is refused; those let in."""
    let_in = []
    for _ in range(tries):
        conn = Conn(idle)
        if not table.admit(conn, network):
            break
        let_in.append(conn)
    return let_in


def test_hosts_that_fill_what_they_can_leave_the_reserve_to_new_ones():
    """Busy hosts, each opening connections until refused: the first stops at its cap, the next at the reserve,
    and each after takes half of what is left of it; the last connection goes to a host holding none."""
    table = ConnectionTable(ServerLimits(max_connections=64, max_connections_per_peer=32, reserved_connections=16))
    taken = [len(fill(table, f"10.0.0.{i}")) for i in range(8)]
    assert taken == [32, 16, 8, 4, 2, 1, 1, 0] and table.open == 64, taken


def test_a_new_host_closes_an_idle_connection_of_the_largest_holder_with_one():
    table = ConnectionTable(ServerLimits(max_connections=8, max_connections_per_peer=8, reserved_connections=1))
    busy, idle = fill(table, "10.0.0.1", tries=3), fill(table, "10.0.0.2", idle=True, tries=4)
    assert table.open == 7 and table.admit(Conn(), "10.0.0.3")  # the last one, to a host holding none
    assert table.admit(Conn(), "10.0.0.4") and table.open == 8  # in place of the oldest idle one
    assert idle[0].evicted and not any(c.evicted for c in busy + idle[1:])
    table.release(idle[0], "10.0.0.2")  # its close arrives: already uncounted
    assert table.open == 8
    assert not table.admit(Conn(), "10.0.0.2")  # a holder of the most takes none back from smaller ones
    assert table.admit(Conn(), "10.0.0.5") and table.admit(Conn(), "10.0.0.6")  # two more idle ones go
    assert not table.admit(Conn(), "10.0.0.7")  # the busy holder of three closes none for another
    assert [c.evicted for c in idle] == [True, True, True, False] and not any(c.evicted for c in busy)


def test_addresses_of_one_ipv6_64_share_one_cap():
    table = ConnectionTable(ServerLimits(max_connections_per_peer=2))
    for address, admitted in (("2001:db8::1", True), ("2001:db8::ffff:2", True), ("2001:db8::3", False),
                              ("2001:db8:0:1::1", True), ("127.0.0.2", True), ("::ffff:127.0.0.2", True),
                              ("127.0.0.2", False)):
        assert table.admit(Conn(), table.network((address, 1))) == admitted, address


@settings(max_examples=300, deadline=None)
@given(total=st.integers(1, 24), per_peer=st.integers(1, 24), reserved=st.integers(1, 24),
       steps=st.lists(st.tuples(st.integers(0, 4), st.sampled_from(["open busy", "open idle", "close", "turn"]),
                                st.integers(0, 23)), max_size=200))
def test_admission_keeps_its_bounds_and_lets_in_whoever_the_rule_says(total, per_peer, reserved, steps):
    """Any opens and closes from five networks: never more than the caps; a network is refused only when the rule
    leaves no room and no network holding more than one above it holds an idle connection; an evicted
    connection was the longest idle of the largest such network."""
    table = ConnectionTable(ServerLimits(max_connections=total, max_connections_per_peer=per_peer,
                                       reserved_connections=reserved))
    held: dict[str, list[Conn]] = {f"net{i}": [] for i in range(5)}
    for step, (index, action, which) in enumerate(steps):
        network, mine = f"net{index}", held[f"net{index}"]
        if action == "close" and mine:
            table.release(mine.pop(which % len(mine)), network)
        elif action == "turn" and mine:  # a kept-alive connection's next request, or the end of one
            conn = mine[which % len(mine)]
            conn.idle, conn.since = not conn.idle, step
            table.update(conn, network)
        elif action.startswith("open"):
            before, n, conn = {k: list(v) for k, v in held.items()}, table.open, Conn(action == "open idle", step)
            room = len(mine) < per_peer and (n < total - reserved or len(mine) < total - n)
            idle_above = [len(v) for k, v in before.items() if len(v) > len(mine) + 1 and any(c.idle for c in v)]
            admitted = table.admit(conn, network)
            evicted = [(k, c) for k, v in before.items() for c in v if c.evicted]
            assert admitted == (len(mine) < per_peer and (room or bool(idle_above))), (before, n)
            assert admitted or mine or n == total  # a network holding none always finds a free connection
            if evicted:
                assert not room and len(evicted) == 1 and evicted[0][1].idle and table.open == n
                network_of, victim = evicted[0]
                longest_idle = min((c for c in before[network_of] if c.idle), key=lambda c: c.since)
                assert len(before[network_of]) == max(idle_above) and victim is longest_idle, (evicted, before)
                held[network_of].remove(victim)
            if admitted:
                mine.append(conn)
        assert table.open == sum(map(len, held.values())) <= total
        assert all(len(v) <= per_peer for v in held.values())
