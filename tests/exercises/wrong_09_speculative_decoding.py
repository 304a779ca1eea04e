"""Planted wrong answers for chapter 09."""


def ngram_propose__earliest_match(token_ids, k, lookup_max, lookup_min):
    for n in range(min(lookup_max, len(token_ids) - 1), lookup_min - 1, -1):
        tail = token_ids[-n:]
        for start in range(0, len(token_ids) - n):
            if token_ids[start:start + n] == tail:
                return token_ids[start + n:start + n + k]
    return []


def ngram_propose__shortest_tail_first(token_ids, k, lookup_max, lookup_min):
    for n in range(lookup_min, min(lookup_max, len(token_ids) - 1) + 1):
        tail = token_ids[-n:]
        for start in range(len(token_ids) - n - 1, -1, -1):
            if token_ids[start:start + n] == tail:
                return token_ids[start + n:start + n + k]
    return []


def accept_greedy__no_bonus_token(target_argmax, proposal):
    out = []
    for want, proposed in zip(target_argmax, proposal):
        out.append(want)
        if want != proposed:
            return out
    return out


def accept_greedy__keeps_matches_after_a_mismatch(target_argmax, proposal):
    out = [t for t, d in zip(target_argmax, proposal) if t == d]
    return out + [target_argmax[len(out)]]


def residual_distribution__not_clamped(p, q):
    r = [a - b for a, b in zip(p, q)]
    return [x / sum(r) if sum(r) else 0.0 for x in r]


def residual_distribution__the_target_again(p, q):
    return list(p)
