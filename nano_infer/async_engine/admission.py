"""Admission: requests waiting for the engine, per tenant, let in by turns and within a fair share.

The engine's scheduler serves its waiting queue first come, first served, so a flood of streams
from one client that reach it first would delay every other client's first token. AsyncLLM therefore
holds requests here and adds them to the engine only as they may run: tenants take turns (round
robin), a tenant's own requests go by vLLM's `priority` (lower first), then by arrival, and a
tenant may have at most `max_num_seqs // (active tenants + 1)` sequences in the engine (always at
least one request). The +1 keeps seats free for a tenant that has none yet, so its first request
is scheduled within a step or two of arriving instead of after a flood's streams finish; the
price is that a tenant alone fills at most half the batch.

Only the engine thread calls it.
"""
from __future__ import annotations

import heapq
import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Generic, TypeVar

Message = TypeVar("Message")


@dataclass(order=True)
class Pending(Generic[Message]):
    priority: int
    arrival: int
    tenant: str = field(compare=False)
    seqs: int = field(compare=False)  # sequences it will run (its n)
    message: Message = field(compare=False)  # what AsyncLLM adds to the engine (an AddRequest)
    cancelled: bool = field(default=False, compare=False)  # aborted, or done with the engine
    admitted: bool = field(default=False, compare=False)


class Admission:
    def __init__(self, max_num_seqs: int):
        self.max_num_seqs = max_num_seqs
        self.queues: dict[str, list[Pending]] = {}  # a heap per tenant with requests waiting
        self.turns: deque[str] = deque()  # tenants with requests waiting, the next to admit first
        self.running: dict[str, int] = {}  # sequences each tenant has in the engine
        self._arrivals = itertools.count()

    def put(self, tenant: str, priority: int, seqs: int, message: tuple) -> Pending:
        item = Pending(priority, next(self._arrivals), tenant, seqs, message)
        if tenant not in self.queues:
            self.queues[tenant] = []
            self.turns.append(tenant)
        heapq.heappush(self.queues[tenant], item)
        return item

    def take(self) -> list[Pending]:
        """The requests to add to the engine now, in turn across tenants."""
        taken, blocked = [], 0
        while self.turns and blocked < len(self.turns):
            tenant = self.turns[0]
            queue = self.queues[tenant]
            while queue and queue[0].cancelled:
                heapq.heappop(queue)
            if not queue:
                del self.queues[tenant]
                self.turns.popleft()
                continue
            self.turns.rotate(-1)
            if not self._may_run(tenant, queue[0].seqs):
                blocked += 1
                continue
            item = heapq.heappop(queue)
            item.admitted = True
            self.running[tenant] = self.running.get(tenant, 0) + item.seqs
            taken.append(item)
            blocked = 0
        return taken

    def _may_run(self, tenant: str, seqs: int) -> bool:
        running = self.running.get(tenant, 0)
        share = max(1, self.max_num_seqs // (len(set(self.running) | set(self.queues)) + 1))
        return running == 0 or running + seqs <= share

    def done(self, item: Pending) -> None:
        """A request admitted by take() left the engine (finished, aborted or failed)."""
        left = self.running[item.tenant] - item.seqs
        if left:
            self.running[item.tenant] = left
        else:
            del self.running[item.tenant]
