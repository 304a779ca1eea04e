"""Chapter 12, reference solutions: `check.blocks_to_offload`, `check.blocks_to_load`, `check.swap_or_recompute`."""


def blocks_to_offload(idle_lru: list[tuple[int, int]], num_needed: int, host_keys: set[int]):
    """idle_lru: (device block, key) of the idle cached blocks, least recently used first. Returns (evicted device
    blocks, LRU first; those among them to copy device -> host, in the same order)."""
    evicted = idle_lru[:num_needed]
    on_host, copies = set(host_keys), []
    for block, key in evicted:
        if key not in on_host:  # the tier is inclusive: a key it holds needs no second copy
            copies.append(block)
            on_host.add(key)
    return [block for block, _ in evicted], copies


def blocks_to_load(prompt_keys: list[int], device_keys: set[int], host_keys: set[int], num_free_device_blocks: int):
    """prompt_keys: the chained keys of the prompt's full blocks, in order. Returns (blocks matched on the device,
    keys to copy host -> device, in order)."""
    num_device = 0
    while num_device < len(prompt_keys) and prompt_keys[num_device] in device_keys:
        num_device += 1
    to_load = []
    for key in prompt_keys[num_device:]:
        if key not in host_keys:  # a chained key covers its whole prefix: after a miss nothing can match
            break
        to_load.append(key)
    return num_device, to_load[:max(0, num_free_device_blocks - 1)]  # one block stays for the tokens to compute


def swap_or_recompute(num_blocks: int, num_recompute_tokens: int, bytes_per_block: int,
                      copy_bytes_per_s: float, prefill_tokens_per_s: float) -> str:
    """A swap copies the blocks out now and back in later; a recompute prefills the tokens no cache serves."""
    swap = 2 * num_blocks * bytes_per_block / copy_bytes_per_s
    recompute = num_recompute_tokens / prefill_tokens_per_s
    return "swap" if swap < recompute else "recompute"
