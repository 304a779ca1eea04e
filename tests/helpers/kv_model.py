"""A dict stands in for the KV pool in the data-structure tests: slot -> what was written there."""


def apply_block_copies(pool: dict, copies: list[tuple[int, int]], block_size: int) -> None:
    """What the runner does before a forward: copy whole blocks (copy-on-write), empty slots included."""
    copy_blocks(pool, pool, copies, block_size)


def copy_blocks(src: dict, dst: dict, pairs: list[tuple[int, int]], block_size: int) -> None:
    """Whole blocks src[i] -> dst[j], empty slots included (what index_select / index_copy_ move): within
    one pool (copy-on-write) or between the device pool and the host tier."""
    for i, j in pairs:
        for off in range(block_size):
            if i * block_size + off in src:
                dst[j * block_size + off] = src[i * block_size + off]
            else:
                dst.pop(j * block_size + off, None)
