"""Admission: requests waiting for the engine, per tenant, let in by turns and within a fair share.

The engine's scheduler serves its waiting queue first come, first served, so a flood of streams
from one client that reach it first would delay every other client's first token. AsyncLLM therefore
holds requests here and adds them to the engine only as they may run: tenants take turns (round
robin), a tenant's own requests go by vLLM's `priority` (lower first), then by arrival, and a
tenant may have at most `max_num_seqs // (active tenants + 1)` sequences in the engine (always at
least one request). The +1 keeps seats free for a tenant that has none yet, so its first request
is scheduled within a step or two of arriving instead of after a flood's streams finish; the
price is that a tenant alone fills at most half the batch.

Seats alone do not bound a tenant's prompts: the scheduler gives each step's token budget to the
prefills already running first, and a few dozen seats of long prompts are dozens of steps that a
newcomer's short prompt waits behind. So a tenant's admitted prompt tokens not yet computed stay
within `prefill_share` (one step's budget; always at least one request): its next prompt joins the
engine when the last one's prefill is done, and a flood of long prompts delays another tenant's first
token by a step or two. A tenant alone loses nothing by it: a step computes no more than its budget.

Logprobs are the engine's memory a client sizes: a request keeps every sampled token's `logprobs` + 1
entries (and its scored prompt's) until it ends, so streams with logprobs that nobody reads (each held
until the send timeout) hold memory in proportion to their count. So a tenant's admitted requests may hold at most
`logprob_share` entries between them (counted at the most each can hold; at least one request), and
the rest wait here, where they hold nothing. Requests without logprobs count nothing.

Only the engine thread calls it.
"""
from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from ..core.request import Request

Message = TypeVar("Message")
# logprob entries one tenant's admitted requests may hold: four replies at the server's cap (MAX_REPLY_LOGPROBS)
LOGPROB_SHARE = 4 * 131_072


@dataclass(order=True)
class Pending(Generic[Message]):
    priority: int
    arrival: int
    tenant: str = field(compare=False)
    seqs: int = field(compare=False)  # sequences it will run (its n)
    message: Message = field(compare=False)  # what AsyncLLM adds to the engine (an AddRequest)
    request_id: str = field(default="", compare=False)
    prompt_tokens: int = field(default=0, compare=False)
    logprob_entries: int = field(default=0, compare=False)  # the most its outputs can hold (logprob_entries())
    cancelled: bool = field(default=False, compare=False)  # aborted, or done with the engine
    admitted: bool = field(default=False, compare=False)


class Admission:
    def __init__(self, max_num_seqs: int, prefill_share: int | None = None, logprob_share: int | None = None):
        self.max_num_seqs, self.prefill_share, self.logprob_share = max_num_seqs, prefill_share, logprob_share
        self.logprobs: dict[str, int] = {}  # logprob entries each tenant's admitted requests may hold
        self.queues: dict[str, list[Pending]] = {}  # a heap per tenant with requests waiting
        self.turns: deque[str] = deque()  # tenants with requests waiting, the next to admit first
        self.running: dict[str, int] = {}  # sequences each tenant has in the engine
        self.prefilling: dict[str, list[Pending]] = {}  # admitted requests whose prompt may not be computed yet
        self._prefill: dict[str, int] = {}  # their prompt tokens not computed yet, as of the last take()
        self._arrivals = itertools.count()

    def put(self, tenant: str, priority: int, seqs: int, message: Message, request_id: str = "",
            prompt_tokens: int = 0, logprob_entries: int = 0) -> Pending:
        item = Pending(priority, next(self._arrivals), tenant, seqs, message, request_id=request_id,
                       prompt_tokens=prompt_tokens, logprob_entries=logprob_entries)
        if tenant not in self.queues:
            self.queues[tenant] = []
            self.turns.append(tenant)
        heapq.heappush(self.queues[tenant], item)
        return item

    def take(self, requests: Mapping[str, Request] = {}) -> list[Pending]:
        """The requests to add to the engine now, in turn across tenants. `requests`: the engine's, to see how
        much of each admitted prompt is computed."""
        self._count_prefill(requests)
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
            if not self._may_run(tenant, queue[0]):
                blocked += 1
                continue
            item = heapq.heappop(queue)
            item.admitted = True
            self.running[tenant] = self.running.get(tenant, 0) + item.seqs
            self.prefilling.setdefault(tenant, []).append(item)
            self._prefill[tenant] = self._prefill.get(tenant, 0) + item.prompt_tokens
            if item.logprob_entries:
                self.logprobs[tenant] = self.logprobs.get(tenant, 0) + item.logprob_entries
            taken.append(item)
            blocked = 0
        return taken

    def _may_run(self, tenant: str, item: Pending) -> bool:
        running, prefill = self.running.get(tenant, 0), self._prefill.get(tenant, 0)
        share = max(1, self.max_num_seqs // (len(set(self.running) | set(self.queues)) + 1))
        if self.prefill_share is not None and prefill and prefill + item.prompt_tokens > self.prefill_share:
            return False
        held = self.logprobs.get(tenant, 0)
        if self.logprob_share is not None and held and held + item.logprob_entries > self.logprob_share:
            return False
        return running == 0 or running + item.seqs <= share

    def _count_prefill(self, requests: Mapping[str, Request]) -> None:
        """Drop the admitted requests whose prompts are computed; count what the others still have to compute."""
        self._prefill = {}
        for tenant, items in list(self.prefilling.items()):
            left = [(item, _uncomputed(requests.get(item.request_id))) for item in items]
            left = [(item, n) for item, n in left if n]
            if left:
                self.prefilling[tenant] = [item for item, _ in left]
                self._prefill[tenant] = sum(n for _, n in left)
            else:
                del self.prefilling[tenant]

    def done(self, item: Pending) -> None:
        """A request admitted by take() left the engine (finished, aborted or failed)."""
        prefilling = self.prefilling.get(item.tenant, [])
        if item in prefilling:
            prefilling.remove(item)
        if item.logprob_entries:
            held = self.logprobs[item.tenant] - item.logprob_entries
            if held:
                self.logprobs[item.tenant] = held
            else:
                del self.logprobs[item.tenant]
        left = self.running[item.tenant] - item.seqs
        if left:
            self.running[item.tenant] = left
        else:
            del self.running[item.tenant]


def _uncomputed(request: Request | None) -> int:
    """Prompt tokens of `request` not computed yet (0 once it has left the engine)."""
    if request is None:
        return 0
    return sum(max(0, s.num_prompt_tokens - s.num_computed_tokens) for s in request.seqs)


def logprob_entries(params, prompt_tokens: int, max_model_len: int) -> int:
    """The most logprob entries a request's outputs can hold: n x its tokens x (logprobs + 1), and its scored
    prompt's rows x (prompt_logprobs + 1)."""
    entries = 0
    logprobs, prompt_logprobs = getattr(params, "logprobs", None), getattr(params, "prompt_logprobs", None)
    if logprobs is not None:
        tokens = params.max_tokens if params.max_tokens is not None else max_model_len - prompt_tokens
        entries += getattr(params, "n", 1) * tokens * (logprobs + 1)
    if prompt_logprobs is not None:
        entries += prompt_tokens * (prompt_logprobs + 1)
    return entries
