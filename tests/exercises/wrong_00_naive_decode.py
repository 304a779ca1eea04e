"""Planted wrong answers for chapter 00: each must be rejected by its checker."""
import torch


def top_k_top_p_filter__nucleus_before_renormalising(logits, top_k, top_p):
    order = logits.argsort(descending=True)
    p = logits.softmax(-1)[order]  # probabilities of the full distribution, not of the top-k
    if top_k > 0:
        order, p = order[:top_k], p[:top_k]
    keep = order[(p.cumsum(0) - p) < top_p]
    out = torch.full_like(logits, float("-inf"))
    out[keep] = logits[keep]
    return out


def top_k_top_p_filter__drops_the_token_that_crosses_top_p(logits, top_k, top_p):
    order = logits.argsort(descending=True)
    if top_k > 0:
        order = order[:top_k]
    p = logits[order].softmax(-1)
    keep = order[p.cumsum(0) <= top_p]
    out = torch.full_like(logits, float("-inf"))
    out[keep] = logits[keep]
    return out


def generate_until_eos__ignores_eos(next_token, prompt_ids, max_new_tokens, eos_token_id):
    ids = list(prompt_ids)
    for _ in range(max_new_tokens):
        ids.append(next_token(ids))
    return ids[len(prompt_ids):]


def generate_until_eos__feeds_only_the_last_token(next_token, prompt_ids, max_new_tokens, eos_token_id):
    ids, out = list(prompt_ids), []
    for _ in range(max_new_tokens):
        token = next_token(ids[-1:])  # what a KV cache would allow, but there is none here
        ids.append(token)
        out.append(token)
        if token == eos_token_id:
            break
    return out
