"""Stage 05: which sequences run in the next engine step, and how many tokens each computes.

Iteration-level (continuous) batching: every step is scheduled afresh under a token
budget (`max_num_batched_tokens`) and a sequence limit (`max_num_seqs`):

1. Running sequences first, in admission order: one token for a decode, or the next
   chunk of a prompt still being prefilled. If the KV pool cannot hold a running
   sequence's next token, the most recently admitted running sequence is preempted: its
   blocks are freed and it goes back to the front of the queue, to be recomputed later
   (with a prefix cache, most of that recompute is a cache hit).
2. Then waiting requests, while budget and KV blocks last. A long prompt is split into
   chunks (chunked prefill), so a step carries decode tokens and a prefill chunk together
   and running requests never stall behind a long prompt. (With chunked prefill off, a
   prompt longer than the budget still runs, alone in its step.)

With speculative decoding (`lookahead`), a decoding sequence asks for 1 + k tokens: its last
token and k proposals verified in the same pass. They count against the budget and get KV
slots like any other tokens; if the pool cannot hold them, the sequence decodes one token.

`policy="lpm"` orders the queue by longest prefix-cache match first (SGLang's default; up to
LPM_MAX_QUEUE waiting requests); `"fcfs"` keeps arrival order. `mode="static"` is the
baseline: admit a batch only when the previous one has completely finished.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .sequence import Sequence, SequenceStatus

# LPM matches every waiting request against the prefix cache at every step. Past this many waiting
# requests the matching costs more than the order saves, and the queue is served first come first
# served (SGLang falls back at 128 as well).
LPM_MAX_QUEUE = 128


@dataclass
class SchedulerOutput:
    scheduled: list[tuple[Sequence, int]] = field(default_factory=list)  # (sequence, tokens to compute)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(n for _, n in self.scheduled)


class Scheduler:
    def __init__(self, kv, prefix_cache, *, max_num_seqs: int, max_num_batched_tokens: int,
                 policy: str = "fcfs", mode: str = "continuous", chunked_prefill: bool = True, lookahead=None):
        if policy not in ("fcfs", "lpm"):
            raise ValueError(f"scheduler_policy={policy!r} is invalid: use 'fcfs' or 'lpm'")
        if mode not in ("continuous", "static"):
            raise ValueError(f"scheduler={mode!r} is invalid: use 'continuous' or 'static'")
        if policy == "lpm" and prefix_cache is None:
            raise ValueError("scheduler_policy='lpm' orders requests by prefix-cache match: set prefix_cache='hash' or 'radix'")
        self.kv = kv  # BlockManager, ContiguousKVCache, or None (no cache: recompute everything)
        self.prefix_cache = prefix_cache
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.policy = policy
        self.mode = mode
        self.chunked_prefill = chunked_prefill and kv is not None
        self.lookahead = lookahead  # seq -> proposal slots to reserve (speculative decoding), or None
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # -- one step -------------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self._schedule_running(out, self.max_num_batched_tokens)
        if not out.preempted and (self.mode == "continuous" or not self.running):
            self._schedule_waiting(out, budget)
        return out

    def _tokens_for(self, seq: Sequence, budget: int) -> int:
        if self.kv is None:  # nothing is cached: every step recomputes the whole sequence
            seq.num_computed_tokens = 0
        n = seq.num_uncomputed_tokens
        return min(n, budget) if self.chunked_prefill else n

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = self._tokens_for(seq, budget)
            if n > budget and out.scheduled:
                break
            if self.lookahead is not None and n == 1:
                n += min(self.lookahead(seq), budget - 1)
                if not self.kv.can_allocate(seq, n):
                    n = 1
            if self.kv is not None:
                while not self.kv.can_allocate(seq, n):
                    victim = self.running.pop()  # the most recently admitted
                    self._preempt(victim)
                    out.preempted.append(victim)
                    if victim is seq:
                        break
                if seq.status is not SequenceStatus.RUNNING:
                    break
                self.kv.allocate(seq, n)
            out.scheduled.append((seq, n))
            budget -= n
            i += 1
        return budget

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> None:
        if self.policy == "lpm" and 1 < len(self.waiting) <= LPM_MAX_QUEUE:
            # stable sort: ties keep arrival order
            self.waiting = deque(sorted(self.waiting, key=lambda s: -len(self.prefix_cache.match(s.token_ids))))
        # a seat for every running sequence and for each sample it will still fork off (n > 1)
        seats = len(self.running) + sum(s.num_pending_forks for s in self.running)
        while self.waiting and budget > 0:
            seq = self.waiting[0]
            if seats + 1 + seq.num_pending_forks > self.max_num_seqs:
                break
            if self.prefix_cache is not None:
                self.prefix_cache.acquire(seq)
            n = self._tokens_for(seq, budget)
            if (n > budget and out.scheduled) or (self.kv is not None and not self.kv.can_allocate(seq, n)):
                self._undo_admission(seq)
                break
            if self.kv is not None:
                self.kv.allocate(seq, n)
            if self.prefix_cache is not None:
                self.prefix_cache.record_admission(seq)
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.scheduled.append((seq, n))
            budget -= n
            seats += 1 + seq.num_pending_forks

    def _undo_admission(self, seq: Sequence) -> None:
        if self.prefix_cache is not None:
            self.prefix_cache.release(seq)
        if self.kv is not None:
            self.kv.free(seq)
        seq.num_computed_tokens = 0

    def _preempt(self, seq: Sequence) -> None:
        """Recompute-style preemption: drop the KV, keep the tokens, requeue at the front."""
        self._undo_admission(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.waiting.appendleft(seq)

    # -- leaving --------------------------------------------------------------------------------
    def finish(self, seq: Sequence, reason: str) -> None:
        """Free a sequence's KV; its full blocks stay in the prefix cache for later requests."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        if self.prefix_cache is not None and seq.block_table:
            self.prefix_cache.cache_computed(seq)
        self._undo_admission(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
