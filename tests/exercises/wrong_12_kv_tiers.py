"""Planted wrong answers for chapter 12."""


def _copies(evicted, host_keys):
    on_host, copies = set(host_keys), []
    for block, key in evicted:
        if key not in on_host:
            copies.append(block)
            on_host.add(key)
    return copies


def blocks_to_offload__evicts_most_recently_used(idle_lru, num_needed, host_keys):
    evicted = idle_lru[::-1][:num_needed]
    return [b for b, _ in evicted], _copies(evicted, host_keys)


def blocks_to_offload__copies_every_block(idle_lru, num_needed, host_keys):
    evicted = [b for b, _ in idle_lru[:num_needed]]
    return evicted, list(evicted)


def blocks_to_offload__evicts_all_idle(idle_lru, num_needed, host_keys):
    return [b for b, _ in idle_lru], _copies(idle_lru, host_keys)


def blocks_to_offload__copies_a_repeated_key_twice(idle_lru, num_needed, host_keys):
    evicted = idle_lru[:num_needed]
    return [b for b, _ in evicted], [b for b, key in evicted if key not in host_keys]


def _device_hits(prompt_keys, device_keys):
    n = 0
    while n < len(prompt_keys) and prompt_keys[n] in device_keys:
        n += 1
    return n


def _host_run(keys, host_keys):
    run = []
    for key in keys:
        if key not in host_keys:
            break
        run.append(key)
    return run


def blocks_to_load__loads_past_a_gap(prompt_keys, device_keys, host_keys, num_free_device_blocks):
    n = _device_hits(prompt_keys, device_keys)
    return n, [k for k in prompt_keys[n:] if k in host_keys][:max(0, num_free_device_blocks - 1)]


def blocks_to_load__loads_what_the_device_has(prompt_keys, device_keys, host_keys, num_free_device_blocks):
    n = _device_hits(prompt_keys, device_keys)
    run = [k for k in _host_run(prompt_keys, device_keys | host_keys) if k in host_keys]
    return n, run[:max(0, num_free_device_blocks - 1)]


def blocks_to_load__device_only(prompt_keys, device_keys, host_keys, num_free_device_blocks):
    return _device_hits(prompt_keys, device_keys), []


def blocks_to_load__no_cap(prompt_keys, device_keys, host_keys, num_free_device_blocks):
    n = _device_hits(prompt_keys, device_keys)
    return n, _host_run(prompt_keys[n:], host_keys)


def blocks_to_load__fills_every_free_block(prompt_keys, device_keys, host_keys, num_free_device_blocks):
    n = _device_hits(prompt_keys, device_keys)
    return n, _host_run(prompt_keys[n:], host_keys)[:num_free_device_blocks]


def swap_or_recompute__copies_one_way(num_blocks, num_recompute_tokens, bytes_per_block, copy_bytes_per_s,
                                      prefill_tokens_per_s):
    swap = num_blocks * bytes_per_block / copy_bytes_per_s
    return "swap" if swap < num_recompute_tokens / prefill_tokens_per_s else "recompute"


def swap_or_recompute__blocks_as_tokens(num_blocks, num_recompute_tokens, bytes_per_block, copy_bytes_per_s,
                                        prefill_tokens_per_s):
    swap = 2 * num_blocks * bytes_per_block / copy_bytes_per_s
    return "swap" if swap < num_blocks / prefill_tokens_per_s else "recompute"


def swap_or_recompute__swaps_on_ties(num_blocks, num_recompute_tokens, bytes_per_block, copy_bytes_per_s,
                                     prefill_tokens_per_s):
    swap = 2 * num_blocks * bytes_per_block / copy_bytes_per_s
    return "swap" if swap <= num_recompute_tokens / prefill_tokens_per_s else "recompute"


def swap_or_recompute__backwards(num_blocks, num_recompute_tokens, bytes_per_block, copy_bytes_per_s,
                                 prefill_tokens_per_s):
    swap = 2 * num_blocks * bytes_per_block / copy_bytes_per_s
    return "swap" if swap > num_recompute_tokens / prefill_tokens_per_s else "recompute"
