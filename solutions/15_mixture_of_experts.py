"""Chapter 15, reference solutions: `check.top_k_route`, `check.all_to_all_counts`."""
import math


def top_k_route(logits: list[list[float]], k: int, renormalise: bool):
    """Softmax over each token's scores (less the largest, so exp cannot overflow), the k largest probabilities
    largest first, divided by their sum when `renormalise`."""
    weights, experts = [], []
    for row in logits:
        exps = [math.exp(x - max(row)) for x in row]
        probs = [e / sum(exps) for e in exps]
        top = sorted(range(len(row)), key=lambda e: -probs[e])[:k]
        chosen = [probs[e] for e in top]
        if renormalise:
            chosen = [p / sum(chosen) for p in chosen]
        weights.append(chosen)
        experts.append(top)
    return weights, experts


def all_to_all_counts(experts: list[list[int]], token_rank: list[int], experts_per_rank: int,
                      world: int) -> list[list[int]]:
    """One row per token-expert pair, from the token's rank to the rank holding the expert."""
    counts = [[0] * world for _ in range(world)]
    for chosen, src in zip(experts, token_rank):
        for e in chosen:
            counts[src][e // experts_per_rank] += 1
    return counts
