"""Planted wrong answers for chapter 15."""
import math


def _route(logits, k, renormalise, smallest=False, softmax=True, over_top_k=False):
    weights, experts = [], []
    for row in logits:
        exps = [math.exp(x - max(row)) for x in row]
        probs = [e / sum(exps) for e in exps] if softmax else list(row)
        top = sorted(range(len(row)), key=lambda e: probs[e] if smallest else -probs[e])[:k]
        chosen = [probs[e] for e in top]
        if renormalise:
            chosen = [p / sum(chosen) for p in chosen]
        if over_top_k:  # a softmax over the k chosen logits alone, whatever renormalise says
            top_exps = [math.exp(row[e] - max(row)) for e in top]
            chosen = [x / sum(top_exps) for x in top_exps]
        weights.append(chosen)
        experts.append(top)
    return weights, experts


def top_k_route__never_renormalises(logits, k, renormalise):
    return _route(logits, k, False)


def top_k_route__always_renormalises(logits, k, renormalise):
    return _route(logits, k, True)


def top_k_route__picks_the_smallest(logits, k, renormalise):
    return _route(logits, k, renormalise, smallest=True)


def top_k_route__logits_as_weights(logits, k, renormalise):
    return _route(logits, k, False, softmax=False)


def top_k_route__softmax_over_the_top_k_only(logits, k, renormalise):
    return _route(logits, k, renormalise, over_top_k=True)  # right when renormalising, not without


def _counts(experts, token_rank, per_rank, world, owner=None, transpose=False, diagonal=True, once_per_rank=False):
    owner = owner or (lambda e: e // per_rank)
    counts = [[0] * world for _ in range(world)]
    for chosen, src in zip(experts, token_rank):
        dsts = [owner(e) for e in chosen]
        for dst in (sorted(set(dsts)) if once_per_rank else dsts):
            if dst == src and not diagonal:
                continue
            s, d = (dst, src) if transpose else (src, dst)
            counts[s][d] += 1
    return counts


def all_to_all_counts__round_robin_experts(experts, token_rank, experts_per_rank, world):
    return _counts(experts, token_rank, experts_per_rank, world, owner=lambda e: e % world)


def all_to_all_counts__sender_and_receiver_swapped(experts, token_rank, experts_per_rank, world):
    return _counts(experts, token_rank, experts_per_rank, world, transpose=True)


def all_to_all_counts__leaves_out_the_rows_that_stay(experts, token_rank, experts_per_rank, world):
    return _counts(experts, token_rank, experts_per_rank, world, diagonal=False)


def all_to_all_counts__one_row_per_token_and_rank(experts, token_rank, experts_per_rank, world):
    return _counts(experts, token_rank, experts_per_rank, world, once_per_rank=True)
