"""Chapter 12: a second, larger tier of KV blocks in host memory, under the prefix cache.

When the device pool runs short, the prefix cache evicts its least recently used idle blocks
(chapters 03-04). Without a second tier their K/V is gone: the next request with that prefix
recomputes it. With one, each evicted block is copied to a host block first, indexed by the
block's `BlockKey` (chapter 03's chained hash of its tokens and of every block before it,
started from the request's cache_salt); a later prefix match that runs past the device cache
continues in this index and copies the blocks back instead of recomputing them (SGLang's
HiCache, vLLM's CPU offloading). The host tier has its own LRU: when it is full, its least
recently used block is dropped for good.

The tier keeps what it loads back (it is inclusive): a block that is evicted again later needs
no second copy out.

It also holds the blocks of sequences preempted by swapping (vLLM v0's swap space): their K/V
is copied out and copied back on re-admission, instead of recomputed. A swapped block that the
prefix cache also holds goes into the index too, so its later eviction copies nothing. What the
tier knows of a sequence or a request is kept here, not on them: each swapped-out sequence's host
blocks (by seq_id), and what each request moved through the tier, which its outputs report.

This class is bookkeeping only, like the BlockManager: a `BlockPool` of host block ids (their
reference counts and free list), an index and the copies still to do. The copies themselves run
in `KVOffloader` before the next forward pass, in one batched copy each way: first device -> host
(the blocks just evicted or swapped, before anything overwrites them), then the step's
copies-on-write, then host -> device. Until the copies are handed over, a host block being read
by a load keeps a reference, so no offload can overwrite it in the same step.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from ..prefix.hashing import BlockKey
from .block_pool import BlockPool


@dataclass
class HostTierStats:
    hit_tokens: int = 0  # prompt tokens of admitted requests loaded back from the host tier
    offloaded_blocks: int = 0  # evicted prefix blocks copied device -> host
    loaded_blocks: int = 0  # prefix blocks copied host -> device for a match
    swapped_out_blocks: int = 0  # blocks of preempted sequences copied device -> host
    swapped_in_blocks: int = 0  # ... and copied back
    dropped_blocks: int = 0  # evicted K/V gone for good: dropped by the tier's LRU, or no host block free
    swap_preemptions: int = 0
    recompute_preemptions: int = 0

    @property
    def blocks_out(self) -> int:
        return self.offloaded_blocks + self.swapped_out_blocks

    @property
    def blocks_in(self) -> int:
        return self.loaded_blocks + self.swapped_in_blocks


@dataclass
class Swapped:
    """A sequence preempted by swapping: the host blocks holding its K/V, in block-table order."""

    blocks: list[int]
    num_tokens: int  # tokens whose K/V they hold: what the sequence had computed when it was swapped out


@dataclass
class RequestTraffic:
    """What one request's sequences moved through the tier: its RequestMetrics' host-tier figures."""

    num_host_cached_tokens: int = 0  # of its prompt's cached tokens at admission, those loaded back from the tier
    blocks_in: int = 0  # host -> device: prefix loads and swap-ins
    blocks_out: int = 0  # device -> host: swap-outs


class HostTier:
    def __init__(self, num_blocks: int, block_size: int, block_bytes: int = 0):
        if num_blocks < 1:
            raise ValueError(f"the host tier holds no block (num_blocks={num_blocks}); raise kv_offloading_size")
        self.num_blocks = num_blocks
        self.block_size = block_size
        # holders of each host block: the index (1 while the block is cached), a load still to copy
        # it back, each swapped-out sequence that lists it
        self.pool = BlockPool(num_blocks)
        self.index: dict[int, int] = {}  # chained hash -> host block
        self.block_key: dict[int, BlockKey] = {}  # host block -> its key, for the blocks in the index
        self.lru: OrderedDict[int, None] = OrderedDict()  # indexed blocks, least recently used first
        self.pending_out: dict[int, tuple[int, bool]] = {}  # host block -> (device block to copy into it, a swap-out?)
        self.pending_in: dict[int, tuple[int, bool]] = {}  # device block -> (host block to copy from, a swap-in?)
        self.releases: list[int] = []  # host blocks whose load reference ends when the copies are taken
        self.stats = HostTierStats()
        self.swapped: dict[int, Swapped] = {}  # seq_id -> its K/V, while it is swapped out
        self.traffic: dict[str, RequestTraffic] = {}  # request_id -> what it moved, until its last output
        self.block_bytes = block_bytes  # one KV block, every layer: what the requests' byte figures count in

    # -- what there is ---------------------------------------------------------------------------
    @property
    def ref_count(self) -> list[int]:
        return self.pool.ref_count

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    def num_cached_blocks(self) -> int:
        return len(self.index)

    def num_available_blocks(self) -> int:
        """Free, plus cached blocks nothing but the index holds (the LRU may drop them)."""
        return self.pool.num_free_blocks + sum(1 for h in self.lru if self.pool.ref_count[h] == 1)

    # -- the prefix index --------------------------------------------------------------------------
    def lookup(self, key: BlockKey) -> int | None:
        """The host block holding `key`, verified against its parent and tokens; marks it recently used."""
        block = self.index.get(key.hash)
        if block is None or self.block_key[block] != key:
            return None
        self.lru.move_to_end(block)
        return block

    def offload(self, key: BlockKey, device_block: int) -> bool:
        """An evicted device block: keep its K/V here. Returns whether a copy was queued (no copy when
        the tier holds the key already, or when every host block is in use)."""
        if key.hash in self.index:  # held already (or a different block under the same hash: keep the old one)
            self.lru.move_to_end(self.index[key.hash])
            return False
        block = self._take()
        if block is None:
            self.stats.dropped_blocks += 1
            return False
        self._index(block, key)  # the index's reference is the one _take gave
        self.pending_out[block] = device_block, False
        self.stats.offloaded_blocks += 1
        return True

    def pin(self, block: int) -> None:
        """A match found this block: hold it until the step's copies are taken (no offload may reuse it)."""
        self.pool.incref(block)
        self.releases.append(block)

    def load(self, seq, block: int, device_block: int) -> None:
        """Copy a pinned host block back into `device_block` of `seq` before the next forward pass."""
        self.pending_in[device_block] = block, False
        self.stats.loaded_blocks += 1
        self._traffic(seq).blocks_in += 1

    def cancel(self, seq, device_block: int) -> None:
        """`seq` freed `device_block` before its copy ran (an admission undone): nothing to copy into it."""
        pending = self.pending_in.pop(device_block, None)
        if pending is None:
            return
        if pending[1]:
            self.stats.swapped_in_blocks -= 1
        else:
            self.stats.loaded_blocks -= 1
        self._traffic(seq).blocks_in -= 1

    def clear(self) -> int:
        """Drop every cached block nothing else holds; returns how many."""
        dropped = [h for h in self.lru if self.pool.ref_count[h] == 1]
        for block in dropped:
            self._drop(block)
        return len(dropped)

    # -- swapped sequences -----------------------------------------------------------------------------
    def swap_out(self, seq, device_blocks: list[int], keys: list[BlockKey | None], num_tokens: int) -> bool:
        """Host blocks for a preempted sequence's first `num_tokens` of K/V (in `device_blocks`); False (nothing
        taken) if they do not fit. A block the prefix cache also holds (its key given) is kept in the
        index too, shared with the sequence: when the device cache evicts its copy later, no second
        copy goes out, and a block already on the host is not copied at all."""
        host = [self.lookup(key) if key is not None else None for key in keys]
        for block in host:
            if block is not None:
                self.pool.incref(block)  # the sequence's, before any _take below could drop it
        misses = [i for i, block in enumerate(host) if block is None]
        if len(misses) > self.num_available_blocks():
            self.free([block for block in host if block is not None])
            return False
        for i in misses:
            block = host[i] = self._take()
            self.pending_out[block] = device_blocks[i], True
            if keys[i] is not None and keys[i].hash not in self.index:
                self._index(block, keys[i])
                self.pool.incref(block)  # the index's, beside the sequence's
        self.stats.swapped_out_blocks += len(misses)
        self.swapped[seq.seq_id] = Swapped(host, num_tokens)
        self._traffic(seq).blocks_out += len(misses)
        return True

    def num_swapped_tokens(self, seq) -> int:
        """Tokens of K/V a swapped-out sequence has here (0: it is not swapped out)."""
        swapped = self.swapped.get(seq.seq_id)
        return swapped.num_tokens if swapped else 0

    def swap_in(self, seq) -> None:
        """`seq` is back on the device (if it was swapped out): copy its host blocks into the first blocks of
        its block table; their references end when the copies are taken."""
        swapped = self.swapped.pop(seq.seq_id, None)
        if swapped is None:
            return
        for block, device_block in zip(swapped.blocks, seq.block_table):
            self.pending_in[device_block] = block, True
        self.releases += swapped.blocks
        self.stats.swapped_in_blocks += len(swapped.blocks)
        self._traffic(seq).blocks_in += len(swapped.blocks)

    def share(self, parent, child) -> None:
        """A swapped sequence forked (n > 1, beam search): the child holds the same host blocks."""
        swapped = self.swapped.get(parent.seq_id)
        if swapped is None:
            return
        for block in swapped.blocks:
            self.pool.incref(block)
        self.swapped[child.seq_id] = Swapped(list(swapped.blocks), swapped.num_tokens)

    def finish(self, seq) -> None:
        """A sequence is done: if it ended while swapped out (aborted, or a pruned beam), its host blocks go."""
        swapped = self.swapped.pop(seq.seq_id, None)
        if swapped is not None:
            self.free(swapped.blocks)

    def free(self, host_blocks: list[int]) -> None:
        for block in host_blocks:
            self._decref(block)

    # -- each request's figures --------------------------------------------------------------------
    def admit(self, seq, num_host_tokens: int) -> None:
        """`seq` starts on a cached prefix of which `num_host_tokens` were loaded back from this tier. A
        request's first admission sets its figure; re-admissions after preemption are recompute."""
        if not seq.num_preemptions:
            self._traffic(seq).num_host_cached_tokens = num_host_tokens

    def record_admission(self, seq) -> None:
        """Count a request's host hits once, when its admission holds (as PrefixCache.record_admission)."""
        if not seq.num_preemptions:
            self.stats.hit_tokens += min(self._traffic(seq).num_host_cached_tokens, seq.num_prompt_tokens)

    def report(self, request_id: str, metrics, done: bool) -> None:
        """Fill a request's RequestMetrics with what it moved through the tier; once it is done, forget it."""
        traffic = self.traffic.pop(request_id, None) if done else self.traffic.get(request_id)
        if traffic is None:
            return
        metrics.num_host_cached_tokens = traffic.num_host_cached_tokens
        metrics.kv_blocks_in, metrics.kv_blocks_out = traffic.blocks_in, traffic.blocks_out
        metrics.kv_bytes_in, metrics.kv_bytes_out = traffic.blocks_in * self.block_bytes, traffic.blocks_out * self.block_bytes

    def _traffic(self, seq) -> RequestTraffic:
        return self.traffic.setdefault(seq.request_id, RequestTraffic())

    # -- the copies --------------------------------------------------------------------------------
    def take_transfers(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """(device -> host, host -> device) block pairs to copy before the next forward pass, in that
        order; the loads' references on their host blocks end here."""
        out = [(device, host) for host, (device, _) in self.pending_out.items()]
        into = [(host, device) for device, (host, _) in self.pending_in.items()]
        self.pending_out, self.pending_in = {}, {}
        releases, self.releases = self.releases, []
        for block in releases:
            self._decref(block)
        return out, into

    # -- internals --------------------------------------------------------------------------------------
    def _take(self) -> int | None:
        """A free host block (reference count 1), dropping the least recently used cached one if none is free."""
        if not self.pool.num_free_blocks:
            victim = next((h for h in self.lru if self.pool.ref_count[h] == 1), None)
            if victim is None:
                return None
            self._drop(victim)
            self.stats.dropped_blocks += 1
        return self.pool.take()

    def _index(self, block: int, key: BlockKey) -> None:
        """Put a block in the index, most recently used (the caller counts the index's reference)."""
        self.index[key.hash] = block
        self.block_key[block] = key
        self.lru[block] = None

    def _drop(self, block: int) -> None:
        """Take a block out of the index (its K/V is gone) and release the index's reference."""
        del self.index[self.block_key.pop(block).hash]
        del self.lru[block]
        self._decref(block)

    def _decref(self, block: int) -> None:
        if self.pool.decref(block):
            self.pending_out.pop(block, None)  # an offload not yet copied: nothing will read it
