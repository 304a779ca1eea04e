"""KVManager: the one owner of KV memory, the block manager and the prefix cache on top of it.

The scheduler and the engine talk to this object only. It calls down into the two parts it
owns, which never call each other: the `BlockManager` (chapter 02) counts references and hands
out free blocks; the `PrefixCache` (chapters 03-04) decides which full blocks stay filled for
later requests. The cache holds one reference on every block it keeps, so a cached block
that no sequence reads has a reference count of 1 ("idle") and is not on the free list; when
the free list runs short the manager asks the cache to give idle blocks back and drops the
cache's reference on each, which frees them.

The same manager wraps the contiguous cache of chapter 01 (one max-length block per sequence,
no prefix cache): the scheduler does not know which one it drives.

With a second tier (chapter 12, `kv_offloading_size`) the manager also drives a `HostTier`:
evicted cached blocks are offloaded to it instead of dropped, a match continues into it and
loads blocks back, and a preempted sequence may be swapped out to it whole. The tier is keyed
by each block's chained hash (the prefix cache's `BlockHashes`), which the manager records for every
block the prefix cache takes, so both caches offload the same way.

Without a prefix cache or a host tier, a stand-in takes its place (`NoPrefixCache`, `NoHostTier`):
one that never matches and holds nothing, one that never hits, offloads or swaps. So no method
here asks what is configured. `NoKVCache` at the end stands in for the whole manager when there
is no KV cache at all.
"""
from __future__ import annotations

from ..prefix.base import PrefixCache
from ..prefix.hashing import BlockKey, salt_of
from ..prefix.no_cache import NoPrefixCache
from ..core.sequence import Sequence
from ..core.utils import cdiv
from .host_tier import HostTier
from .no_tier import NoHostTier


class KVManager:
    def __init__(self, blocks, prefix_cache: PrefixCache | None = None, tier: HostTier | None = None, cost=None,
                 preemption_mode: str = "recompute"):
        self.blocks = blocks  # BlockManager, or ContiguousKVCache
        # HashPrefixCache or RadixPrefixCache; none given: the stand-in that never matches
        self.prefix_cache = prefix_cache if prefix_cache is not None else NoPrefixCache(blocks.block_size)
        self.tier = tier if tier is not None else NoHostTier()  # the host tier (chapter 12), or its stand-in
        self.cost = cost  # kv.cost.CostModel: swap or recompute, for preemption_mode="auto"
        self.preemption_mode = preemption_mode
        self.block_size = blocks.block_size
        self.num_blocks = blocks.num_blocks
        self.num_evicted_blocks = 0  # cached blocks given back to make room, ever
        self.block_keys: dict[int, BlockKey] = {}  # cached device block -> its tier key

    # -- what there is ----------------------------------------------------------------------------
    @property
    def ref_count(self) -> list[int]:
        return self.blocks.ref_count

    @property
    def num_free_blocks(self) -> int:
        return self.blocks.num_free_blocks

    @property
    def num_available_blocks(self) -> int:
        """Free now, plus idle blocks only the prefix cache holds (it gives them up on demand)."""
        return self.blocks.num_free_blocks + self.prefix_cache.num_evictable_blocks()

    def holds(self, block: int) -> bool:
        """Does the prefix cache keep this block filled for later requests?"""
        return self.prefix_cache.holds(block)

    def match_len(self, token_ids: list[int], salt: str | None = None) -> int:
        """Blocks of `token_ids` the prefix cache could serve (the LPM policy's sort key)."""
        return len(self.prefix_cache.match(token_ids, salt))

    # -- admission and allocation ---------------------------------------------------------------------
    def acquire(self, seq: Sequence) -> int:
        """Admit a sequence onto its cached prefix: share the blocks, skip their prefill, and set
        `num_computed_tokens` to where it starts. Returns the tokens served from the caches, both tiers.

        If the whole sequence is cached, the last token is still computed (its logits give
        the first output token); writing its K/V into the shared last block triggers a
        copy-on-write of that one block. A sequence that still scores its prompt (prompt
        logprobs) takes no hit: the positions a hit skips are the rows it needs (as in vLLM).
        A sequence swapped out to the host tier comes back whole, copied in by `allocate`.
        """
        assert not seq.block_table and seq.num_computed_tokens == 0
        swapped = self.tier.num_swapped_tokens(seq)
        if swapped:  # it starts where it was preempted; allocate() copies its blocks back in
            seq.num_computed_tokens = swapped
            return 0
        blocks = [] if seq.scores_prompt else self.prefix_cache.match(seq.token_ids, salt_of(seq))
        for block in blocks:
            if self.blocks.ref_count[block] == 1:  # idle: only the cache held it
                self.prefix_cache.on_referenced(block)
            self.blocks.incref(block, seq)
        seq.block_table = list(blocks)
        self.prefix_cache.lock(seq, blocks)
        hits = [] if seq.scores_prompt else self._match_in_tier(seq)
        num_cached = (len(blocks) + len(hits)) * self.block_size
        # an 8-bit pool's sequence starts at a block boundary: the open block's exact copy is computed, not cached
        seq.num_computed_tokens = self.blocks.open_blocks.resume_at(min(num_cached, len(seq) - 1))
        self._load_from_tier(seq, hits)
        self.tier.admit(seq, max(0, seq.num_computed_tokens - len(blocks) * self.block_size))
        return num_cached

    def _match_in_tier(self, seq: Sequence) -> list[int]:
        """Continue the match in the host tier: the host blocks of the next blocks of `seq`, held until
        their copies run. One device block is left for the tokens the sequence still computes."""
        hits, room = [], self.num_available_blocks - 1
        for i in range(len(seq.block_table), len(self.prefix_cache.hashes.of(seq))):
            host = self.tier.lookup(self.prefix_cache.hashes.key(seq, i)) if len(hits) < room else None
            if host is None:
                break
            self.tier.pin(host)  # the evictions below may offload into the tier: keep the hits
            hits.append(host)
        return hits

    def _load_from_tier(self, seq: Sequence, hits: list[int]) -> None:
        """Each host hit gets a device block after the matched ones, and a copy back before the next
        forward pass (`num_computed_tokens` counts the hits already)."""
        if not hits:
            return
        num_matched = len(seq.block_table)
        self.allocate(seq, (num_matched + len(hits)) * self.block_size - seq.num_computed_tokens)
        for host, device in zip(hits, seq.block_table[num_matched:]):
            self.tier.load(seq, host, device)

    def record_admission(self, seq: Sequence) -> None:
        """The admission holds: count its prompt's hits, once per request."""
        self.prefix_cache.record_admission(seq)
        self.tier.record_admission(seq)

    def can_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        return (self.blocks.num_blocks_needed(seq, num_new_tokens) <= self.num_available_blocks
                and self.blocks.open_blocks.has_room(seq))

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None:
        """Room for the next `num_new_tokens` K/V entries, evicting idle cached blocks if the free list is short."""
        short = self.blocks.num_blocks_needed(seq, num_new_tokens) - self.blocks.num_free_blocks
        if short > 0:
            self.evict(short)
        num_copies = len(self.blocks.pending_copies)
        self.blocks.allocate(seq, num_new_tokens)
        for src, _ in self.blocks.pending_copies[num_copies:]:  # copy-on-write left the cached original to the cache
            self._unreferenced(src)
        self.tier.swap_in(seq)  # back from a swap: the first blocks of the new table are copied in

    def evict(self, num_blocks: int, offload: bool = True) -> int:
        """Free up to `num_blocks` idle cached blocks, least recently used first; returns how many.
        With a host tier each goes there first (unless `offload` is False)."""
        freed = self.prefix_cache.evict(num_blocks)
        for block in freed:
            assert self.blocks.ref_count[block] == 1, f"evicting block {block} still in use"
            key = self.block_keys.pop(block)
            if offload:
                self.tier.offload(key, block)
            self.blocks.decref(block, op="evict")
        self.num_evicted_blocks += len(freed)
        return len(freed)

    def take_copies(self) -> list[tuple[int, int]]:
        """The copy-on-write (src, dst) block copies the runner must do before the next forward pass."""
        copies, self.blocks.pending_copies = self.blocks.pending_copies, []
        return copies

    def take_open_block_copies(self) -> list[tuple[int, int]]:
        """The (src, dst) open-block row copies of forks (8-bit K/V), due with the block copies."""
        return self.blocks.open_blocks.take_copies()

    # -- during and after a step ------------------------------------------------------------------------
    def cache_computed(self, seq: Sequence) -> None:
        """Offer the sequence's full computed blocks to the prefix cache; it takes a reference on each it keeps."""
        self._hold(seq, self.prefix_cache.cache_computed(seq))

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """n > 1: the child reads the parent's blocks (and its cached prefix); writes copy on write.
        A parent swapped out to the host tier shares its host blocks instead."""
        self.blocks.fork(parent, child)
        self.prefix_cache.hashes.fork(parent, child)
        self.tier.share(parent, child)
        self._hold(parent, self.prefix_cache.fork(parent, child))

    def _hold(self, seq: Sequence, new: list[int]) -> None:
        """The cache's reference on each block it newly keeps, and the block's key (for the host tier)."""
        for block in new:
            self.blocks.incref(block)
        if new:
            where = {b: i for i, b in enumerate(seq.block_table)}
            for block in new:
                self.block_keys[block] = self.prefix_cache.hashes.key(seq, where[block])

    def truncate(self, seq: Sequence, num_tokens: int) -> None:
        """Speculative rollback: keep the blocks of the first `num_tokens` positions only."""
        self.blocks.truncate(seq, num_tokens)

    def free(self, seq: Sequence) -> None:
        """Drop the sequence's references (finished or preempted); blocks the cache keeps turn idle."""
        table = seq.block_table
        self.prefix_cache.release(seq)
        self.blocks.free(seq)
        for block in reversed(table):  # the tail turns idle first: evicted before the head
            self._unreferenced(block)
            if self.blocks.ref_count[block] == 0:
                self.tier.cancel(seq, block)  # an undone admission's load: nothing left to copy into

    def swap_out(self, seq: Sequence) -> bool:
        """Preemption by swapping (chapter 12): copy the sequence's computed blocks to the host tier and
        free them here; re-admitted, it starts where it was (`acquire`) and copies back in (`allocate`).
        False (and nothing done) when the mode says recompute, the cost rule prefers it, or the tier is full."""
        swapped = False
        if self._should_swap(seq):
            # an 8-bit pool's open block stays behind: swapped back in, the sequence computes it again
            num_tokens = self.blocks.open_blocks.resume_at(seq.num_computed_tokens)
            table = seq.block_table[: cdiv(num_tokens, self.block_size)]
            swapped = bool(table) and self.tier.swap_out(seq, table, [self.block_keys.get(b) for b in table], num_tokens)
        if not swapped:
            self.tier.stats.recompute_preemptions += 1
            return False
        self.free(seq)
        self.tier.stats.swap_preemptions += 1
        return True

    def _should_swap(self, seq: Sequence) -> bool:
        """The mode's answer. Always recomputed: a sequence with nothing computed, one whose K/V is
        still being copied in, and an idle one (a beam waiting for its siblings: recomputed, it offers
        its row again; swapped, it would come back with nothing to run)."""
        num_blocks = cdiv(seq.num_computed_tokens, self.block_size)
        if not num_blocks or not seq.num_uncomputed_tokens or any(b in self.tier.pending_in for b in seq.block_table):
            return False
        if self.preemption_mode == "auto":
            return self.cost.prefer_swap(num_blocks, self._recompute_tokens(seq))
        return self.preemption_mode == "swap"

    def _recompute_tokens(self, seq: Sequence) -> int:
        """Tokens a recompute would prefill again: those past what the prefix cache and the tier hold
        of its computed blocks (the full ones are cached as they are computed)."""
        num_full, bs = seq.num_computed_tokens // self.block_size, self.block_size
        cached = len(self.prefix_cache.match(seq.token_ids[: num_full * bs], salt_of(seq)))
        while cached < num_full and self.tier.lookup(self.prefix_cache.hashes.key(seq, cached)) is not None:
            cached += 1
        return seq.num_computed_tokens - cached * bs

    def take_transfers(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """(device -> host, host -> device) block copies due before the next forward pass (none without a tier)."""
        return self.tier.take_transfers()

    def _unreferenced(self, block: int) -> None:
        """A sequence dropped `block`: if only the cache holds it now, it is idle (evictable)."""
        if self.blocks.ref_count[block] == 1 and self.prefix_cache.holds(block):
            self.prefix_cache.on_unreferenced(block)

    def finish(self, seq: Sequence) -> None:
        """A sequence is done: its full blocks stay in the prefix cache for later requests, the rest are freed."""
        if seq.block_table:
            self.cache_computed(seq)
        self.free(seq)
        self.prefix_cache.hashes.drop(seq)  # kept while it is preempted: its tokens only ever grow
        self.tier.finish(seq)  # ended while swapped out (aborted, or a pruned beam): its host blocks go

    def clear(self) -> int:
        """Evict every idle cached block, from both tiers (nothing is offloaded); returns how many device blocks were freed."""
        self.tier.clear()
        return self.evict(self.num_available_blocks - self.blocks.num_free_blocks, offload=False)


class NoKVCache:
    """kv_cache="none" (chapter 00): no K/V survives a step, so each step computes every sequence whole,
    from its first token. The scheduler drives it like a KVManager; it allocates nothing."""

    def __init__(self):
        self.tier = NoHostTier()  # what each request's outputs report of a host tier: nothing

    def cache_computed(self, seq: Sequence) -> None:
        """After each step: nothing was kept, so the next step computes the sequence again."""
        seq.num_computed_tokens = 0

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """A beam forked mid-step shares no K/V either: it computes from its first token."""
        child.num_computed_tokens = 0

    def acquire(self, seq: Sequence) -> int:
        return 0

    def can_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        return True

    def take_copies(self) -> list[tuple[int, int]]:
        return []

    def take_open_block_copies(self) -> list[tuple[int, int]]:
        return []

    def swap_out(self, seq: Sequence) -> bool:
        return False

    def allocate(self, seq: Sequence, num_new_tokens: int) -> None: ...
    def record_admission(self, seq: Sequence) -> None: ...
    def free(self, seq: Sequence) -> None: ...
    def finish(self, seq: Sequence) -> None: ...
