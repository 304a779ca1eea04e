"""Chapter 05: which sequences run in the next engine step, and how many tokens each computes.

Iteration-level (continuous) batching: every step is scheduled afresh under a token
budget (`max_num_batched_tokens`) and a sequence limit (`max_num_seqs`):

1. Running sequences first, in admission order: one token for a decode, or the next
   chunk of a prompt still being prefilled. If the KV pool cannot hold a running
   sequence's next token, the most recently admitted running sequence is preempted: its
   blocks are freed and it goes back to the front of the queue, to be recomputed later
   (with a prefix cache, most of that recompute is a cache hit), or, with a host tier
   (chapter 12), its K/V is swapped out and copied back in when it is admitted again.
2. Then waiting requests, while budget and KV blocks last. A long prompt is split into
   chunks (chunked prefill), so a step carries decode tokens and a prefill chunk together
   and running requests never stall behind a long prompt. (With chunked prefill off, a
   prompt longer than the budget still runs, alone in its step.)

A running sequence with nothing to compute (a beam whose next token waits for its siblings'
rows, beam search) is skipped; if that leaves a step with nothing to run, idle sequences are
preempted until the queue's head fits, so the one they wait for can come back.

With speculative decoding (`lookahead`), a decoding sequence asks for 1 + k tokens: its last
token and k proposals verified in the same pass. They count against the budget and get KV
slots like any other tokens; if the pool cannot hold them, the sequence decodes one token.

Each scheduled sequence becomes one `ScheduledSeq` (core/batch.py): what it computes this step, decided
here once and read by the plug-ins, the model runner and the output processor after it.

`policy="lpm"` orders the queue by longest prefix-cache match first (SGLang's default; up to
LPM_MAX_QUEUE waiting requests); `"fcfs"` keeps arrival order. `mode="static"` is the
baseline: admit a batch only when the previous one has completely finished.

A prompt being scored (prompt logprobs) is prefilled `max_scored_rows` rows a step at most, shared by
all such prompts: scoring costs its own request more steps, not every other request a slower one.

With `prompt_share` < 1 (the engine's is WAITING_PROMPT_SHARE), while a request waits and a seat is free
for it, the running prompts' chunks take at most that share of the budget together (`_prompt_room`): a
short prompt that arrives behind a long one is computed in the next step, not after every chunk of the
long one. The budget is still spent whole (the waiting request takes the rest), and a prompt alone
gets all of it.

`num_computed_tokens` moves in two places only: the KVManager sets it at admission (the cached
prefix), and this scheduler advances it after a step (`advance`, called by whoever turns the
step's rows into tokens), resets it on preemption and copies it on a fork. Without a KV cache
(kv_cache="none") the scheduler drives `NoKVCache`, which keeps nothing between steps.
"""
from __future__ import annotations

import sys
from collections import deque
from collections.abc import Callable

from ..core.batch import ScheduledSeq, SchedulerOutput
from ..core.sequence import Sequence, SequenceStatus
from ..kv.manager import KVManager, NoKVCache

# LPM matches every waiting request against the prefix cache at every step. Past this many waiting
# requests the matching costs more than the order saves, and the queue is served first come first
# served (SGLang falls back at 128 as well).
LPM_MAX_QUEUE = 128
# logits a step may normalize to score prompt rows (each a log_softmax, rank and top-k over the vocabulary): a whole
# prompt chunk of a large vocabulary's rows in one step makes every other tenant's first token wait for it;
# 2**23 is 55 rows of Qwen2.5's 152,064, 170 of SmolLM2's 49,152.
SCORED_LOGITS_PER_STEP = 2**23
# the share of a step's budget running prompt chunks keep while a request waits: a server's newcomer behind
# another tenant's long prompts is computed in the next step
WAITING_PROMPT_SHARE = 0.5


def scored_rows_per_step(vocab_size: int) -> int:
    return max(1, SCORED_LOGITS_PER_STEP // vocab_size)


class Scheduler:
    def __init__(self, kv: KVManager | None = None, *, max_num_seqs: int, max_num_batched_tokens: int,
                 policy: str = "fcfs", mode: str = "continuous", chunked_prefill: bool = True,
                 lookahead: Callable[[Sequence], int] | None = None, max_scored_rows: int = sys.maxsize,
                 prompt_share: float = 1.0):
        self.kv = kv if kv is not None else NoKVCache()  # the KVManager; none: every step recomputes
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_scored_rows = max_scored_rows  # prompt rows scored per step, by every scoring prompt together
        self.prompt_share = prompt_share  # of the budget, for running prompt chunks while a request waits
        self.policy = policy
        self.mode = mode
        # with no KV cache a chunk's K/V would be gone before the next chunk: a prompt runs whole
        self.chunked_prefill = chunked_prefill and kv is not None
        self.lookahead = lookahead or (lambda seq: 0)  # seq -> proposal slots to reserve (speculative decoding)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    # -- one step -------------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        self._rows_left = self.max_scored_rows
        budget = self._schedule_running(out, self.max_num_batched_tokens, self._prompt_room())
        if not out.preempted and (self.mode == "continuous" or not self.running):
            self._schedule_waiting(out, budget)
        while not out.scheduled and self.waiting and self._preempt_idle(out):
            self._schedule_waiting(out, budget)  # nothing could run: idle sequences made room
        out.copies = self.kv.take_copies()
        out.open_block_copies = self.kv.take_open_block_copies()
        return out

    def _tokens_for(self, seq: Sequence, budget: int) -> int:
        """All its tokens, or with chunked prefill a chunk within the budget and, for a prompt being scored,
        within the rows the step has left to score (0 when none are: it waits for the next step)."""
        n, scored = seq.num_uncomputed_tokens, seq.sampling.prompt_logprobs
        if not self.chunked_prefill:
            return n
        if scored is not None and len(scored) < seq.num_prompt_tokens:  # positions already scored need no rows
            n = min(n, max(seq.num_computed_tokens, len(scored) - 1) + self._rows_left - seq.num_computed_tokens)
        return min(n, budget)

    def _prompt_room(self) -> int:
        """Tokens the running sequences' prompt chunks may take this step: `prompt_share` of the budget while a
        waiting request has a seat to take, else all of it."""
        if self.prompt_share >= 1 or not self.waiting or self.mode != "continuous" or not self.chunked_prefill:
            return self.max_num_batched_tokens
        if self._seats_taken() + 1 + self.waiting[0].num_pending_forks > self.max_num_seqs:
            return self.max_num_batched_tokens
        return max(1, int(self.max_num_batched_tokens * self.prompt_share))

    def _seats_taken(self) -> int:
        """A seat for every running sequence and for each sample it will still fork off (n > 1)."""
        return len(self.running) + sum(s.num_pending_forks for s in self.running)

    def _schedule_running(self, out: SchedulerOutput, budget: int, prompt_room: int) -> int:
        # an idle sequence computes nothing: a beam whose next token waits for its siblings' rows (beam search)
        for seq in [s for s in self.running if s.num_uncomputed_tokens]:
            if budget <= 0 or seq.status is not SequenceStatus.RUNNING:
                break  # out of budget, or preempted to make room for one before it
            chunk = seq.num_uncomputed_tokens > 1  # a prompt (or a recompute), not a decode
            if chunk and prompt_room <= 0:
                continue
            n = self._tokens_for(seq, min(budget, prompt_room) if chunk else budget)
            if n == 0:
                continue  # a prompt being scored, and no rows left this step
            prompt_room -= n if chunk else 0
            if n > budget and out.scheduled:
                break
            lookahead = min(self.lookahead(seq), budget - 1) if n == 1 else 0
            if lookahead and not self.kv.can_allocate(seq, 1 + lookahead):
                lookahead = 0  # no room for the proposals: a plain decode
            while not self.kv.can_allocate(seq, n + lookahead):
                victim = self.running.pop()  # the most recently admitted
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is seq:
                    return budget
            self.kv.allocate(seq, n + lookahead)
            out.scheduled.append(ScheduledSeq(seq, seq.num_computed_tokens, n, lookahead))
            self._rows_left -= out.scheduled[-1].num_prompt_logit_rows
            budget -= n + lookahead
        return budget

    def _schedule_waiting(self, out: SchedulerOutput, budget: int) -> None:
        if self.policy == "lpm" and 1 < len(self.waiting) <= LPM_MAX_QUEUE:
            # stable sort: ties keep arrival order
            self.waiting = deque(sorted(self.waiting, key=lambda s: -self.kv.match_len(s.token_ids, s.params.cache_salt)))
        seats = self._seats_taken()
        scoring = []  # prompts to score with no rows left this step: the requests behind them go first
        while self.waiting and budget > 0:
            seq = self.waiting[0]
            if seats + 1 + seq.num_pending_forks > self.max_num_seqs:
                break
            self.kv.acquire(seq)  # its cached prefix: num_computed_tokens starts past it
            n = self._tokens_for(seq, budget)
            if n == 0:
                self._undo_admission(seq)
                scoring.append(self.waiting.popleft())
                continue
            if (n > budget and out.scheduled) or not self.kv.can_allocate(seq, n):
                self._undo_admission(seq)
                break
            self.kv.allocate(seq, n)
            self.kv.record_admission(seq)
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.scheduled.append(ScheduledSeq(seq, seq.num_computed_tokens, n))
            self._rows_left -= out.scheduled[-1].num_prompt_logit_rows
            budget -= n
            seats += 1 + seq.num_pending_forks
        self.waiting.extendleft(reversed(scoring))  # back in front, in their order

    def _preempt_idle(self, out: SchedulerOutput) -> bool:
        """Free the most recently admitted idle sequence, if any, to the back of the queue.

        Idle sequences hold blocks but compute nothing; if the one they wait for cannot be
        admitted, they would wait forever. At the back of the queue they recompute after it.
        """
        idle = next((s for s in reversed(self.running) if s.num_uncomputed_tokens == 0), None)
        if idle is None:
            return False
        self.running.remove(idle)
        self._preempt(idle)
        self.waiting.rotate(-1)  # _preempt put it first
        out.preempted.append(idle)
        return True

    def _undo_admission(self, seq: Sequence) -> None:
        """Give back what `acquire` took; the next try finds the same cached prefix again."""
        self.kv.free(seq)
        seq.num_computed_tokens = 0

    def _preempt(self, seq: Sequence) -> None:
        """Drop the KV and recompute it later, or (with a host tier) swap it out and copy it back in;
        keep the tokens, requeue at the front. Re-admitted, it starts past what the caches hold
        (the swapped-out K/V included)."""
        if not self.kv.swap_out(seq):
            self.kv.free(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.waiting.appendleft(seq)

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """The child (n > 1, a beam) starts where the parent is, on its blocks, and queues beside it."""
        child.num_computed_tokens = parent.num_computed_tokens
        self.kv.fork(parent, child)
        child.status = parent.status
        if parent.status is SequenceStatus.RUNNING:
            self.running.append(child)
        else:  # a preempted beam: both recompute when admitted
            self.waiting.insert(self.waiting.index(parent) + 1, child)

    # -- after a step, and leaving -----------------------------------------------------------------
    def advance(self, seq: Sequence, num_computed_tokens: int) -> None:
        """The step computed the K/V of `seq` up to `num_computed_tokens` (a verify: up to its accepted
        tokens); its next step starts there. Called as the step's rows become tokens, before they are appended."""
        seq.num_computed_tokens = num_computed_tokens

    def update_from_output(self, out: SchedulerOutput) -> None:
        """The step is over: the full blocks it computed go into the prefix cache."""
        for entry in out.scheduled:
            if not entry.seq.is_finished:
                self.kv.cache_computed(entry.seq)

    def finish(self, seq: Sequence, reason: str) -> None:
        """Free a sequence's KV; its full blocks stay in the prefix cache for later requests."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.kv.finish(seq)
        seq.num_computed_tokens = 0
        seq.status = SequenceStatus.finished(reason)
