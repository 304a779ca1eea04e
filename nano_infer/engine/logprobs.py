"""Logprobs: of each sampled token (`SamplingParams.logprobs`) and of the prompt (`prompt_logprobs`).

Both are read off logit rows the step computes anyway, in the model's raw distribution (before
temperature, top-k/top-p and constraints), in float32: {token id: Logprob} with the token's rank
and the k most likely tokens.

The prompt is scored by its prefill. The logit row at prompt position p is the model's
distribution of the token at p + 1, and a prefill computes every prompt position to fill its
K/V: keeping those rows (`ScheduledSeq.num_prompt_logit_rows`) scores the whole prompt with no
extra forward pass. The log-likelihood of a continuation given a context, what lm-eval's
multiple-choice tasks compare, is a sum of these scores.

- The first token has no score (None): nothing comes before it.
- Chunked prefill: each chunk scores the positions it computes, in order.
- A prefix-cache hit skips computing the cached positions, and with them their rows, so a
  request whose prompt is not scored yet takes no hit (`KVManager.acquire`), as in vLLM; its
  blocks still go into the cache for the requests after it.
- A request preempted before its prompt is scored computes it again from the start; the rows it
  scored already are not asked for twice.
"""
from __future__ import annotations

import torch

from ..outputs import Logprob

# Prompt rows normalized at once: each chunk takes a few [rows, vocab] float32 temporaries
# (256 rows of a 152k vocabulary: 156 MB each), however long the prompt.
ROWS_PER_CHUNK = 256


def logprob_entries(logits: torch.Tensor, targets: list[int], ks: list[int]) -> list[dict[int, Logprob]]:
    """Per row of `logits`: {token: Logprob} of the row's target token, with its rank, and of the
    row's k most likely tokens."""
    lp = logits.float().log_softmax(dim=-1)
    target = torch.tensor(targets, device=lp.device)[:, None]
    chosen = lp.gather(1, target)
    ranks = ((lp > chosen).sum(dim=-1) + 1).tolist()
    k_max = max(ks)
    top = lp.topk(k_max) if k_max else None
    values, ids = (top.values.tolist(), top.indices.tolist()) if top is not None else ([], [])
    out = []
    for i, (token, value, k) in enumerate(zip(targets, chosen[:, 0].tolist(), ks)):
        entry = {token: Logprob(value, ranks[i])}
        for rank, (v, tid) in enumerate(zip(values[i][:k], ids[i][:k]) if k else (), start=1):
            entry.setdefault(tid, Logprob(v, rank))
        out.append(entry)
    return out


def decode_entries(entries: list[dict[int, Logprob] | None], token_texts: list[str]) -> None:
    """Fill each Logprob's decoded_token (vLLM's field) from `token_texts`, every token's own text decoded
    once: a lookup per entry, where decoding 126,000 echoed prompt entries one by one took the engine ~1 s."""
    for entry in entries:
        for tid, lp in (entry or {}).items():
            lp.decoded_token = token_texts[tid] if tid < len(token_texts) else ""


def score_prompts(logits: torch.Tensor, scored: list[tuple], token_texts: list[str]) -> None:
    """Append to each `seq.sampling.prompt_logprobs` the entries of the prompt tokens its rows score.
    `scored` is [(ScheduledSeq, its first logit row, its number of prompt rows)]."""
    rows, targets, ks = [], [], []
    for entry, row, count in scored:
        seq = entry.seq
        first = len(seq.sampling.prompt_logprobs)  # the next token to score; its row is at position first - 1
        assert entry.start <= first - 1, "the row of a prompt token to score was not computed"
        rows += range(row, row + count)
        targets += seq.token_ids[first : first + count]
        ks += [seq.params.prompt_logprobs] * count
    entries = []
    for lo in range(0, len(rows), ROWS_PER_CHUNK):
        part = slice(lo, lo + ROWS_PER_CHUNK)
        entries += logprob_entries(logits[rows[part]], targets[part], ks[part])
    decode_entries(entries, token_texts)
    at = 0
    for entry, _, count in scored:
        entry.seq.sampling.prompt_logprobs += entries[at : at + count]
        at += count
