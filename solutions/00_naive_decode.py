"""Chapter 00, reference solutions: `check.top_k_top_p_filter`, `check.generate_until_eos`."""
import torch


def top_k_top_p_filter(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """logits [V] -> the same logits with every token outside top-k and the top-p nucleus set to -inf.

    top_k <= 0 means no top-k. The nucleus is computed on the distribution left after top-k
    (renormalised), and a token stays if the tokens ranked before it cover less than top_p.
    """
    order = logits.argsort(descending=True)
    if top_k > 0:
        order = order[:top_k]
    p = logits[order].softmax(-1)
    keep = order[(p.cumsum(0) - p) < top_p]
    out = torch.full_like(logits, float("-inf"))
    out[keep] = logits[keep]
    return out


def generate_until_eos(next_token, prompt_ids: list[int], max_new_tokens: int, eos_token_id: int) -> list[int]:
    """Generate up to max_new_tokens ids; `next_token(all_ids_so_far)` picks each one.

    Stops right after producing eos_token_id (which is kept in the output).
    """
    ids = list(prompt_ids)
    out = []
    for _ in range(max_new_tokens):
        token = next_token(ids)
        ids.append(token)
        out.append(token)
        if token == eos_token_id:
            break
    return out
