"""Planted wrong answers for chapter 03."""
from nano_infer.prefix.hashing import ROOT_HASH, chain_hash


def block_hashes__no_parent_key(token_ids, block_size):
    return [chain_hash(ROOT_HASH, tuple(token_ids[s:s + block_size]))
            for s in range(0, len(token_ids) - block_size + 1, block_size)]


def block_hashes__hashes_the_partial_block(token_ids, block_size):
    keys, parent = [], ROOT_HASH
    for start in range(0, len(token_ids), block_size):
        parent = chain_hash(parent, tuple(token_ids[start:start + block_size]))
        keys.append(parent)
    return keys


def _keys(token_ids, block_size):
    keys, parent = [], ROOT_HASH
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = chain_hash(parent, tuple(token_ids[start:start + block_size]))
        keys.append(parent)
    return keys


def lookup_prefix__skips_over_a_miss(hash_to_block, token_ids, block_size):
    return [hash_to_block[k] for k in _keys(token_ids, block_size) if k in hash_to_block]


def lookup_prefix__misses_the_last_full_block(hash_to_block, token_ids, block_size):
    blocks = []
    for key in _keys(token_ids[:-1], block_size):  # off by one: a prompt that ends on a block boundary
        if key not in hash_to_block:
            break
        blocks.append(hash_to_block[key])
    return blocks
