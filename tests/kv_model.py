"""A dict stands in for the KV pool in the data-structure tests: slot -> what was written there."""


def apply_block_copies(pool: dict, copies: list[tuple[int, int]], block_size: int) -> None:
    """What the runner does before a forward: copy whole blocks (copy-on-write), empty slots included."""
    for src, dst in copies:
        for off in range(block_size):
            if src * block_size + off in pool:
                pool[dst * block_size + off] = pool[src * block_size + off]
            else:
                pool.pop(dst * block_size + off, None)
