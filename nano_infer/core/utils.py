"""Small helpers more than one part of the engine needs."""


def cdiv(a: int, b: int) -> int:
    """Ceiling division: how many blocks of `b` hold `a` (tokens -> blocks, rows -> shards)."""
    return -(-a // b)
