"""Chapter 03, reference solutions: `check.block_hashes`, `check.lookup_prefix`."""
from nano_infer.prefix.hashing import ROOT_HASH, chain_hash


def block_hashes(token_ids: list[int], block_size: int) -> list[int]:
    """One key per *full* block: chain_hash(key of the previous block, this block's tokens as a tuple).

    The first block's parent is ROOT_HASH; a partial last block gets no key.
    """
    keys, parent = [], ROOT_HASH
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = chain_hash(parent, tuple(token_ids[start:start + block_size]))
        keys.append(parent)
    return keys


def lookup_prefix(hash_to_block: dict[int, int], token_ids: list[int], block_size: int) -> list[int]:
    """The cached blocks of the longest prefix of token_ids found in hash_to_block (whole blocks)."""
    blocks = []
    for key in block_hashes(token_ids, block_size):
        if key not in hash_to_block:
            break  # the blocks after a miss belong to another prefix, even if their keys are cached
        blocks.append(hash_to_block[key])
    return blocks
