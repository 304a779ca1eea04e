"""Chapter 12 exercises: offload evicted blocks to the host tier, load a prefix back, swap or recompute."""
from __future__ import annotations

from hypothesis import strategies as st

from ..kv.cost import prefer_swap, recompute_seconds, swap_seconds
from ..kv.host_tier import HostTier
from ..prefix.hashing import BlockKey
from .core import call, exercise, expect, forall

_keys = st.integers(0, 7)  # few distinct keys, so that evicted blocks often find theirs on the host already


def _block_key(key: int) -> BlockKey:
    """A learner's key as the HostTier's (chained hash, parent's hash, tokens); only the hash matters here."""
    return BlockKey(key, 0, (key,))


@st.composite
def _offload_cases(draw):
    """Idle cached blocks, least recently used first (a key may repeat), how many to give back, the host's keys."""
    keys = draw(st.lists(_keys, max_size=8))
    idle = [(10 + i, key) for i, key in enumerate(keys)]
    return idle, draw(st.integers(0, len(idle) + 2)), draw(st.sets(_keys))


@exercise
def blocks_to_offload(candidate):
    """Your eviction gives back the least recently used blocks and copies out only those the host tier lacks."""

    def prop(case):
        idle, num_needed, host = case
        tier = HostTier(len(host) + len(idle) + 1, block_size=1)  # big enough that it drops nothing
        for key in sorted(host):
            tier.offload(_block_key(key), 0)
        tier.take_transfers()
        evicted = idle[:num_needed]  # the prefix cache evicts its idle blocks LRU first
        want = ([b for b, _ in evicted], [b for b, key in evicted if tier.offload(_block_key(key), b)])
        desc = f"idle_lru={idle}, num_needed={num_needed}, host_keys={sorted(host)}"
        got = call(candidate, list(idle), num_needed, set(host), case=desc)
        expect(isinstance(got, tuple) and len(got) == 2, desc, "(evicted, copies)", got,
               why="return a pair: the device blocks evicted, then those among them to copy to the host")
        evicted, copies = list(got[0]), list(got[1])
        expect(evicted == want[0], desc, want[0], evicted, why="device blocks evicted (least recently used first):")
        expect(copies == want[1], desc, want[1], copies, why="evicted blocks to copy to the host (in eviction order):")

    # two idle blocks with one key (copied once); a key the host holds (no copy); fewer needed than idle
    forall(_offload_cases(), prop, max_examples=60,
           examples=[([(10, 5), (11, 5)], 2, set()), ([(10, 1), (11, 2), (12, 3)], 2, {2})])


@st.composite
def _load_cases(draw):
    """A prompt's chained keys, each held by the device cache, the host tier, both or neither; free device blocks."""
    prompt = draw(st.lists(st.integers(0, 40), unique=True, max_size=8))
    where = [draw(st.sampled_from(["device", "host", "both", "neither"])) for _ in prompt]
    device = {k for k, w in zip(prompt, where) if w in ("device", "both")} | draw(st.sets(st.integers(41, 45)))
    host = {k for k, w in zip(prompt, where) if w in ("host", "both")} | draw(st.sets(st.integers(41, 45)))
    return prompt, device, host, draw(st.integers(0, 10))


def _load_reference(prompt: list[int], device: set[int], host: set[int], num_free: int) -> tuple[int, list[int]]:
    """The device match, then the host tier's run right after it, as many as the free blocks allow but one."""
    num_device = 0
    while num_device < len(prompt) and prompt[num_device] in device:
        num_device += 1
    run = []
    for key in prompt[num_device:]:
        if key not in host:
            break
        run.append(key)
    return num_device, run[:max(0, num_free - 1)]


@exercise
def blocks_to_load(candidate):
    """Your match takes the device prefix, continues in the host tier without a gap, and loads no more than fits."""

    def prop(case):
        prompt, device, host, num_free = case
        want = _load_reference(prompt, device, host, num_free)
        desc = (f"prompt_keys={prompt}, device_keys={sorted(device)}, host_keys={sorted(host)}, "
                f"num_free_device_blocks={num_free}")
        got = call(candidate, list(prompt), set(device), set(host), num_free, case=desc)
        expect(isinstance(got, tuple) and len(got) == 2, desc, "(num_device_hits, keys_to_load)", got,
               why="return a pair: how many blocks the device cache matches, then the keys to load from the host")
        expect(got[0] == want[0], desc, want[0], got[0], why="blocks matched in the device cache:")
        expect(list(got[1]) == want[1], desc, want[1], list(got[1]), why="keys to load from the host tier (in order):")

    # a key in neither tier breaks the chain; the host holds a device hit too; the cap of free blocks minus one
    forall(_load_cases(), prop, max_examples=60,
           examples=[([1, 2, 3], set(), {1, 3}, 5), ([1, 2, 3], {1}, {1, 2}, 5), ([1, 2, 3], set(), {1, 2, 3}, 3),
                     ([1, 2], {1}, {2}, 0)])


def _powers_of_two(lo: int, hi: int):
    """Sizes and rates as powers of two: every cost is then exact, so ties really happen."""
    return st.integers(lo, hi).map(lambda e: 2**e)


@exercise
def swap_or_recompute(candidate):
    """Your choice swaps only when copying the blocks out and back in is strictly faster than prefilling again."""

    def prop(case):
        num_blocks, tokens, block_bytes, copy_rate, prefill_rate = case
        want = "swap" if prefer_swap(num_blocks, tokens, block_bytes, copy_rate, prefill_rate) else "recompute"
        desc = (f"num_blocks={num_blocks}, num_recompute_tokens={tokens}, bytes_per_block={block_bytes}, "
                f"copy_bytes_per_s={copy_rate}, prefill_tokens_per_s={prefill_rate}")
        got = call(candidate, num_blocks, tokens, block_bytes, copy_rate, prefill_rate, case=desc)
        swap, recompute = swap_seconds(num_blocks, block_bytes, copy_rate), recompute_seconds(tokens, prefill_rate)
        once = "swap" if swap / 2 < recompute else "recompute"
        if swap == recompute:
            why = (f"a tie: the round trip takes {swap:.6g} s and the prefill {recompute:.6g} s; a swap must be "
                   "strictly faster, so a tie recomputes:")
        elif got == once != want:
            why = (f"a swap copies the blocks out now and back in later, {swap / 2:.6g} s each way, {swap:.6g} s "
                   f"in all, against a recompute of {recompute:.6g} s; your answer fits a single copy:")
        else:
            why = f"a swap (out and back in) takes {swap:.6g} s, a recompute {recompute:.6g} s:"
        expect(got == want, desc, want, got, why=why)

    # drawn cases are never ties, so a copy counted once shows as itself and not as a `<` against `<=`
    cases = st.tuples(st.integers(0, 64), st.integers(0, 1024), _powers_of_two(10, 20),
                      _powers_of_two(20, 34).map(float), _powers_of_two(4, 14).map(float)).filter(
        lambda c: swap_seconds(c[0], c[2], c[3]) != recompute_seconds(c[1], c[4]))
    # one way cheaper than the prefill but the round trip not; the round trip cheaper; a tie (1 s each)
    forall(cases, prop, max_examples=60, examples=[
        (256, 384, 2**20, 2.0**30, 1024.0), (256, 1024, 2**20, 2.0**30, 1024.0), (1, 100, 1024, 2048.0, 100.0)])
