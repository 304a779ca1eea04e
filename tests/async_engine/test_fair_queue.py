"""FairQueue: each tenant's work queued apart, served by least worker time used, bounded, paced.

Through the server: attack tests 17 (tokenizing), 5 (parsing) and 3 (rendering) in tests/api_server/test_attacks.py."""
import asyncio
import threading
import time

import pytest

from nano_infer.async_engine.fair_queue import FairQueue, TenantBacklogFull


def test_a_tenant_arriving_behind_a_backlog_waits_for_one_item_not_all():
    queue = FairQueue(1, 100, "test")
    order, gate = [], threading.Event()
    try:
        hold(queue, gate)  # until the backlog is in place
        backlog = [queue.submit("a", order.append, f"a{i}") for i in range(5)]
        late = queue.submit("b", order.append, "b")
        gate.set()
        late.result(5)
        for f in backlog:
            f.result(5)
        assert order[0] == "b", order
    finally:
        gate.set()
        queue.close()


def hold(queue, gate: threading.Event) -> None:
    """Occupy the one worker with an item of tenant "a" until `gate` is set."""
    started = threading.Event()
    queue.submit("a", lambda: (started.set(), gate.wait()))
    assert started.wait(5)


def test_a_tenant_past_its_backlog_is_refused_and_others_are_not():
    queue, gate = FairQueue(1, 3, "test"), threading.Event()
    try:
        hold(queue, gate)
        for _ in range(3):
            queue.submit("a", time.sleep, 0)
        with pytest.raises(TenantBacklogFull):
            queue.submit("a", time.sleep, 0)
        queue.submit("b", time.sleep, 0)  # another tenant's queue is its own
    finally:
        gate.set()
        queue.close()


def test_cost_not_count_decides_the_turn():
    """a's items take 100 ms, b's nothing: one of a's costs more than all of b's, which go before a's next
    (taking turns by count would put an a between each two b)."""
    queue, order, gate = FairQueue(1, 100, "test"), [], threading.Event()

    def work(name, seconds):
        time.sleep(seconds)
        order.append(name)

    try:
        hold(queue, gate)
        futures = [queue.submit("a", work, "a", 0.1) for _ in range(3)] + [queue.submit("b", work, "b", 0) for _ in range(3)]
        gate.set()
        for f in futures:
            f.result(5)
        assert order[-2:] == ["a", "a"], order
    finally:
        gate.set()
        queue.close()


def test_a_paced_tenant_waits_between_its_items_and_a_cancelled_item_is_dropped():
    queue = FairQueue(1, 100, "test", duty=0.5)

    async def run():
        start = time.monotonic()
        for _ in range(3):
            await queue.run("a", time.sleep, 0.1)
        paced = time.monotonic() - start
        blocked = asyncio.ensure_future(queue.run("a", time.sleep, 0.3))
        dropped = asyncio.ensure_future(queue.run("a", pytest.fail, "a cancelled item ran"))
        await asyncio.sleep(0.05)
        dropped.cancel()
        await blocked
        await asyncio.sleep(0.4)  # where the dropped item would have run, after a's pause
        return paced

    try:
        assert asyncio.run(run()) >= 0.5  # 3 x 0.1 s of work, a 0.1 s pause after each of the first two
    finally:
        queue.close()
