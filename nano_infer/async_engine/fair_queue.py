"""FairQueue: the CPU work tenants push through the server off the engine thread, served in turn.

Tokenizing a prompt, parsing a body and rendering a large reply are Python work a client chooses the
size of. On one first-come thread for everyone, one tenant's backlog delayed everybody behind it:
64 chats of 57,000 characters (refused in the end) put another tenant's first token 12.2 s late (24x),
three bodies of 72 such prompts 72 s. Here every tenant has a queue of its own, and a free worker
takes the next item of the tenant that has used the least worker time among those waiting (fair
queueing by cost, not by count: one large item counts as many small ones). A tenant arriving finds
the others' backlogs behind it, so it waits at most for the items already running.

Each tenant's queue is bounded (`max_backlog` items; past it `TenantBacklogFull`, a 429), and with
`duty` < 1 a tenant may keep one worker busy at most that fraction of the time: it runs one item at a
time, and after an item of t seconds its next item waits t * (1 / duty - 1). Worker threads hold the
GIL while they parse, and every torch call of the engine thread waits for it, so a tenant that kept a
worker (or two at once) busy without pause slowed everyone's streams; paced, the flood slows its sender.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections import deque


class TenantBacklogFull(RuntimeError):
    """This tenant has `max_backlog` items queued already: it should retry later (a 429)."""


class FairQueue:
    def __init__(self, threads: int, max_backlog: int, name: str, duty: float = 1.0):
        if threads < 1 or max_backlog < 1 or not 0 < duty <= 1:
            raise ValueError(f"FairQueue needs threads >= 1, max_backlog >= 1 and 0 < duty <= 1 "
                             f"(got {threads}, {max_backlog}, {duty})")
        self.max_backlog, self.duty = max_backlog, duty
        self._cond = threading.Condition()
        self._queues: dict[str, deque] = {}  # per tenant with work queued or running: (future, fn, args)
        self._used: dict[str, float] = {}  # worker seconds each such tenant has used (its virtual time)
        self._running: dict[str, int] = {}
        self._ready_at: dict[str, float] = {}  # paced: when the tenant's next item may start
        self._closed = False
        self._threads = [threading.Thread(target=self._work, name=f"nano_infer-{name}-{i}", daemon=True)
                         for i in range(threads)]
        for thread in self._threads:
            thread.start()

    async def run(self, tenant: str | None, fn, *args):
        """fn(*args) on a worker, in the tenant's turn. Cancelling the caller drops the item if it has not started."""
        return await asyncio.wrap_future(self.submit(tenant, fn, *args))

    def submit(self, tenant: str | None, fn, *args) -> concurrent.futures.Future:
        tenant = tenant or ""
        future = concurrent.futures.Future()
        with self._cond:
            if self._closed:
                raise RuntimeError("the server is shutting down")
            queue = self._queues.get(tenant)
            if queue is None:  # a tenant that joins starts level with the least served one, not at 0
                queue = self._queues[tenant] = deque()
                self._used[tenant] = min(self._used.values(), default=0.0)
                self._running[tenant] = 0
            if len(queue) >= self.max_backlog:
                raise TenantBacklogFull(f"{len(queue)} items of yours are queued for the server's workers (tokenizing, "
                                        f"parsing, rendering), the most it holds for one client; retry shortly")
            queue.append((future, fn, args))
            self._cond.notify()
        return future

    def close(self) -> None:
        with self._cond:
            self._closed = True
            for queue in self._queues.values():
                for future, _, _ in queue:
                    future.cancel()
            self._cond.notify_all()

    def _take(self):
        with self._cond:
            while not self._closed:
                now = time.monotonic()
                waiting = [t for t, q in self._queues.items() if q]
                ready = [t for t in waiting if self._ready_at.get(t, 0.0) <= now
                         and (self.duty == 1 or not self._running[t])]
                if ready:
                    tenant = min(ready, key=self._used.__getitem__)
                    self._running[tenant] += 1
                    return tenant, self._queues[tenant].popleft()
                self._cond.wait(min((self._ready_at.get(t, now) for t in waiting), default=now + 3600) - now)
        return None

    def _work(self) -> None:
        while (taken := self._take()) is not None:
            self._run(*taken)
            taken = None  # an idle worker holds nothing of the last item (a reply's outputs)

    def _run(self, tenant: str, item: tuple) -> None:
        future, fn, args = item
        start = time.monotonic()
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(fn(*args))
            except BaseException as e:  # noqa: BLE001 - the caller gets it
                future.set_exception(e)
        with self._cond:
            spent = time.monotonic() - start
            self._used[tenant] += spent
            self._running[tenant] -= 1
            if self.duty < 1:
                self._ready_at[tenant] = time.monotonic() + spent * (1 / self.duty - 1)
            if not self._running[tenant] and not self._queues[tenant]:  # idle: only its pause is kept
                for table in (self._queues, self._used, self._running):
                    del table[tenant]
                now = time.monotonic()
                self._ready_at = {t: at for t, at in self._ready_at.items() if at > now}
            self._cond.notify_all()
