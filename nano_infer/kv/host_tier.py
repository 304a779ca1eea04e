"""Stage 12: a second, larger tier of KV blocks in host memory, under the prefix cache.

When the device pool runs short, the prefix cache evicts its least recently used idle blocks
(stages 03-04). Without a second tier their K/V is gone: the next request with that prefix
recomputes it. With one, each evicted block is copied to a host block first, indexed by the
block's chained hash (the hash of its tokens and of every block before it, as in stage 03,
started from the request's cache_salt); a later prefix match that runs past the device cache
continues in this index and copies the blocks back instead of recomputing them (SGLang's
HiCache, vLLM's CPU offloading). The host tier has its own LRU: when it is full, its least
recently used block is dropped for good.

The tier keeps what it loads back (it is inclusive): a block that is evicted again later needs
no second copy out.

It also holds the blocks of sequences preempted by swapping (vLLM v0's swap space): their K/V
is copied out and copied back on re-admission, instead of recomputed. A swapped block that the
prefix cache also holds goes into the index too, so its later eviction copies nothing.

This class is bookkeeping only, like the BlockManager: ids, reference counts, an index and the
copies still to do. The copies themselves run in `KVOffloader` before the next forward pass, in
one batched copy each way: first device -> host (the blocks just evicted or swapped, before
anything overwrites them), then the step's copies-on-write, then host -> device. Until the copies are handed over, a host block
being read by a load keeps a reference, so no offload can overwrite it in the same step.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

BlockKey = tuple[int, int, tuple[int, ...]]  # (chained hash, parent's chained hash, the block's tokens)


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


class HostTier:
    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1:
            raise ValueError(f"the host tier holds no block (num_blocks={num_blocks}); raise kv_offloading_size")
        self.num_blocks = num_blocks
        self.block_size = block_size
        # holders of each host block: the index (1 while the block is cached), a load still to copy
        # it back, each swapped-out sequence that lists it
        self.ref_count = [0] * num_blocks
        self.free_blocks: list[int] = list(reversed(range(num_blocks)))
        self.index: dict[int, int] = {}  # chained hash -> host block
        self.block_key: dict[int, BlockKey] = {}  # host block -> its key, for the blocks in the index
        self.lru: OrderedDict[int, None] = OrderedDict()  # indexed blocks, least recently used first
        self.pending_out: dict[int, tuple[int, bool]] = {}  # host block -> (device block to copy into it, a swap-out?)
        self.pending_in: dict[int, tuple[int, bool]] = {}  # device block -> (host block to copy from, a swap-in?)
        self.releases: list[int] = []  # host blocks whose load reference ends when the copies are taken
        self.stats = HostTierStats()

    # -- what there is ---------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    def num_cached_blocks(self) -> int:
        return len(self.index)

    def num_available_blocks(self) -> int:
        """Free, plus cached blocks nothing but the index holds (the LRU may drop them)."""
        return len(self.free_blocks) + sum(1 for h in self.lru if self.ref_count[h] == 1)

    # -- the prefix index --------------------------------------------------------------------------
    def lookup(self, key: BlockKey) -> int | None:
        """The host block holding `key`, verified against its parent and tokens; marks it recently used."""
        block = self.index.get(key[0])
        if block is None or self.block_key[block] != key:
            return None
        self.lru.move_to_end(block)
        return block

    def offload(self, key: BlockKey, device_block: int) -> bool:
        """An evicted device block: keep its K/V here. Returns whether a copy was queued (no copy when
        the tier holds the key already, or when every host block is in use)."""
        if key[0] in self.index:  # held already (or a different block under the same hash: keep the old one)
            self.lru.move_to_end(self.index[key[0]])
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
        self.ref_count[block] += 1
        self.releases.append(block)

    def load(self, block: int, device_block: int) -> None:
        """Copy a pinned host block back into `device_block` before the next forward pass."""
        self.pending_in[device_block] = block, False
        self.stats.loaded_blocks += 1

    def cancel(self, device_block: int) -> bool:
        """`device_block` was freed before its copy ran (an admission undone): nothing to copy into it.
        Returns whether a load was pending."""
        pending = self.pending_in.pop(device_block, None)
        if pending is None:
            return False
        if pending[1]:
            self.stats.swapped_in_blocks -= 1
        else:
            self.stats.loaded_blocks -= 1
        return True

    def clear(self) -> int:
        """Drop every cached block nothing else holds; returns how many."""
        dropped = [h for h in self.lru if self.ref_count[h] == 1]
        for block in dropped:
            self._drop(block)
        return len(dropped)

    # -- swapped sequences -----------------------------------------------------------------------------
    def swap_out(self, device_blocks: list[int], keys: list[BlockKey | None]) -> tuple[list[int], int] | None:
        """Host blocks for a preempted sequence's K/V, and how many copies that queued; None (nothing
        taken) if they do not fit. A block the prefix cache also holds (its key given) is kept in the
        index too, shared with the sequence: when the device cache evicts its copy later, no second
        copy goes out, and a block already on the host is not copied at all."""
        host = [self.lookup(key) if key is not None else None for key in keys]
        for block in host:
            if block is not None:
                self.ref_count[block] += 1  # the sequence's, before any _take below could drop it
        misses = [i for i, block in enumerate(host) if block is None]
        if len(misses) > self.num_available_blocks():
            self.free([block for block in host if block is not None])
            return None
        for i in misses:
            block = host[i] = self._take()
            self.pending_out[block] = device_blocks[i], True
            if keys[i] is not None and keys[i][0] not in self.index:
                self._index(block, keys[i])
                self.ref_count[block] += 1  # the index's, beside the sequence's
        self.stats.swapped_out_blocks += len(misses)
        return host, len(misses)

    def swap_in(self, host_blocks: list[int], device_blocks: list[int]) -> None:
        """Copy a swapped sequence back; its references end when the copies are taken."""
        for block, device_block in zip(host_blocks, device_blocks):
            self.pending_in[device_block] = block, True
        self.releases += host_blocks
        self.stats.swapped_in_blocks += len(host_blocks)

    def share(self, host_blocks: list[int]) -> list[int]:
        """A swapped sequence forked (n > 1, beam search): the child holds the same host blocks."""
        for block in host_blocks:
            self.ref_count[block] += 1
        return list(host_blocks)

    def free(self, host_blocks: list[int]) -> None:
        """A swapped sequence finished or was aborted while out."""
        for block in host_blocks:
            self._decref(block)

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
        if not self.free_blocks:
            victim = next((h for h in self.lru if self.ref_count[h] == 1), None)
            if victim is None:
                return None
            self._drop(victim)
            self.stats.dropped_blocks += 1
        block = self.free_blocks.pop()
        self.ref_count[block] = 1
        return block

    def _index(self, block: int, key: BlockKey) -> None:
        """Put a block in the index, most recently used (the caller counts the index's reference)."""
        self.index[key[0]] = block
        self.block_key[block] = key
        self.lru[block] = None

    def _drop(self, block: int) -> None:
        """Take a block out of the index (its K/V is gone) and release the index's reference."""
        key = self.block_key.pop(block)
        del self.index[key[0]]
        del self.lru[block]
        self._decref(block)

    def _decref(self, block: int) -> None:
        assert self.ref_count[block] > 0, f"host block {block} freed twice"
        self.ref_count[block] -= 1
        if self.ref_count[block] == 0:
            self.pending_out.pop(block, None)  # an offload not yet copied: nothing will read it
            self.free_blocks.append(block)
