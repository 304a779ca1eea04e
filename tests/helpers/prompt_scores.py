"""Prompt logprobs checked against transformers' log_softmax of the prompt (float32)."""
import torch

from tests.helpers.model_factory import hf_model

ATOL = 1e-4
K = 3


def hf_scores(model_dir, token_lists) -> list[torch.Tensor]:
    """transformers' log_softmax at every prompt position: row p scores token p + 1."""
    hf = hf_model(model_dir)
    with torch.no_grad():
        return [hf(torch.tensor([p])).logits[0].float().log_softmax(-1)[:-1] for p in token_lists]


def score_error(scores, prompt: list[int], want: torch.Tensor, k: int = K) -> float:
    """Check one request's prompt logprobs against transformers; returns the largest difference."""
    assert len(scores) == len(prompt) and scores[0] is None
    worst = 0.0
    for row, token, entry in zip(want, prompt[1:], scores[1:]):
        top = row.topk(k).indices.tolist()
        assert set(entry) == set(top) | {token}
        assert entry[token].rank == int((row > row[token]).sum()) + 1
        assert [entry[t].rank for t in top] == list(range(1, k + 1))
        worst = max([worst] + [abs(lp.logprob - row[t].item()) for t, lp in entry.items()])
    assert worst < ATOL, worst
    return worst
