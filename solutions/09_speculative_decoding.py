"""Chapter 09, reference solutions: `check.ngram_propose`, `check.accept_greedy`, `check.residual_distribution`."""


def ngram_propose(token_ids: list[int], k: int, lookup_max: int, lookup_min: int) -> list[int]:
    """Up to k tokens that followed the most recent earlier occurrence of the sequence's last n tokens,
    for the largest n in [lookup_min, lookup_max] that occurs earlier; [] if none does."""
    for n in range(min(lookup_max, len(token_ids) - 1), lookup_min - 1, -1):
        tail = token_ids[-n:]
        for start in range(len(token_ids) - n - 1, -1, -1):  # latest first; never the tail itself
            if token_ids[start:start + n] == tail:
                return token_ids[start + n:start + n + k]
    return []


def accept_greedy(target_argmax: list[int], proposal: list[int]) -> list[int]:
    """target_argmax[j]: the target's greedy token after the first j proposals (len(proposal) + 1 of them).
    Returns the tokens to append: proposals while they match, then the target's token."""
    out = []
    for want, proposed in zip(target_argmax, proposal):
        out.append(want)
        if want != proposed:
            return out
    return out + [target_argmax[len(proposal)]]


def residual_distribution(p: list[float], q: list[float]) -> list[float]:
    """max(0, p - q), normalised to sum to 1."""
    r = [max(0.0, a - b) for a, b in zip(p, q)]
    total = sum(r)
    return [x / total for x in r]
