"""vLLM's logits processors, batched: what SamplingParams' penalties and token rules do to a step's logit rows.

Each rule runs as a few tensor ops over the rows that use it (a step's other rows are not
touched), so a batch of 256 rows with one penalised request costs one gather/scatter, not 256
Python loops over the vocabulary. logit_bias and allowed_token_ids come as tensors made once per
request (SamplingParams.token_rules): a step scatters each request's once, however many rows (its
n samples) read it, and no step makes a Python object per id. Other index lists (which token of
which row) are built in Python, from token lists the sequences hold anyway. The rules see a `Row`,
not a sequence: a speculative verify scores k + 1 positions of one sequence, each after a different
prefix of the proposal, and passes a row for each (spec/decoder.py), all of one request.

Order, as in vLLM: logit_bias, allowed_token_ids, bad_words, min_tokens, then the penalties. A
constraint's mask is added before all of them (sampling.py); min_p and the temperature come after.
"""
from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass

import torch

from ..sampling_params import SamplingParams, TokenRules

NEG_INF = float("-inf")


@dataclass
class Row:
    """What a rule reads of one logit row: the request's params and the tokens before the row."""

    params: SamplingParams
    prompt_token_ids: list[int]
    output_token_ids: list[int]


def rows_of(seqs) -> list[Row]:
    return [Row(s.params, s.prompt_token_ids, s.output_token_ids) for s in seqs]


def apply_logits_rules(logits: torch.Tensor, rows: list[Row], eos_token_ids) -> torch.Tensor:
    """logits [N, V] for `rows`, as a new tensor (the raw logits stay for logprobs)."""
    logits = logits.clone()
    for rule in (_logit_bias, _allowed_token_ids, _bad_words, _min_tokens, _repetition_penalty,
                 _presence_frequency_penalties):
        rule(logits, rows, eos_token_ids)
    return logits


def _forbid(logits: torch.Tensor, pairs: list[tuple[int, int]]) -> None:
    """-inf at each (row, token); ids past the logit rows (an EOS id of a padded vocabulary) are skipped."""
    pairs = [(i, t) for i, t in pairs if t < logits.shape[-1]]
    if pairs:
        rows, tokens = torch.tensor(pairs, device=logits.device).T
        logits[rows, tokens] = NEG_INF


def _token_counts(lists: list[list[int]], vocab_size: int, device) -> torch.Tensor:
    """[len(lists), vocab_size] float: how often each token occurs in each list, by one scatter-add."""
    counts = torch.zeros(len(lists), vocab_size + 1, device=device)  # the extra column takes ids past the rows
    tokens = torch.tensor(list(itertools.chain.from_iterable(lists)), dtype=torch.long, device=device)
    rows = torch.repeat_interleave(torch.arange(len(lists), device=device),
                                   torch.tensor([len(t) for t in lists], device=device))
    counts.index_put_((rows, tokens.clamp(max=vocab_size)), torch.ones_like(tokens, dtype=counts.dtype), accumulate=True)
    return counts[:, :vocab_size]


def _logit_bias(logits, rows, _eos) -> None:
    """Each request's bias added to its rows (to what is there: a constraint's -inf stays). Few (row, id)
    pairs in all (a vocabulary row's worth at most) are added where they fall; more, and each request's
    bias is scattered into one vocabulary row, added to its rows whole."""
    at, group, rules = _by_request(rows, 0, logits.device)
    if not rules:
        return
    width, device = logits.shape[-1], logits.device
    ids, values = torch.cat([r[0] for r in rules]), torch.cat([r[1] for r in rules]).to(logits.dtype)
    sizes = [len(r[0]) for r in rules]
    per_row = [sizes[g] for g in group]
    if sum(per_row) > width:
        bias = _by_row(_dense([r[0] for r in rules], values, logits), group)
        _in_rows(logits, at, lambda part: part.add_(bias))
        return
    starts = [0, *itertools.accumulate(sizes)]
    count = torch.tensor(per_row, device=device)
    # pair k of a row: its request's ids from where they start, k counted from the row's first pair
    pos = torch.arange(sum(per_row), device=device) + torch.tensor(
        [starts[g] for g in group], device=device).sub(count.cumsum(0) - count).repeat_interleave(count)
    ids, values = ids[pos], values[pos]
    logits.index_put_((torch.tensor(at, device=device).repeat_interleave(count), ids.clamp(max=width - 1)),
                      torch.where(ids < width, values, 0.0), accumulate=True)  # an id past the rows adds 0: no sync


def _allowed_token_ids(logits, rows, _eos) -> None:
    """Each request's allowed ids scattered into one mask of the vocabulary; the rest of its rows -inf."""
    at, group, rules = _by_request(rows, 2, logits.device)
    if rules:
        drop = _by_row(~_dense([r[2] for r in rules], True, logits), group)
        _in_rows(logits, at, lambda part: part.masked_fill_(drop, NEG_INF))


def _by_row(per_request: torch.Tensor, group: list[int]) -> torch.Tensor:
    """Each row's line of `per_request` ([requests, V]); one request's line is broadcast, not copied per row."""
    return per_request if len(per_request) == 1 else per_request[torch.tensor(group, device=per_request.device)]


def _in_rows(logits: torch.Tensor, at: list[int], change) -> None:
    """`change` (in place) applied to rows `at` of the logits: to the tensor itself where they are all of it."""
    if len(at) == len(logits):
        change(logits)
    else:
        index = torch.tensor(at, device=logits.device)
        logits[index] = change(logits[index])


def _by_request(rows, which: int, device) -> tuple[list[int], list[int], list[tuple]]:
    """The rows whose request has tensor `which` of its TokenRules (bias ids, bias values, allowed ids), the
    request of each (an index into the third), and each request's tensors on `device`. A request's rows
    (its samples, a verify's positions) share one TokenRules, so its tensors are read once a step."""
    at, group, seen = [], [], {}
    for i, r in enumerate(rows):
        rules = r.params.compact_token_rules()
        if (rules.bias_ids, rules.bias_values, rules.allowed_ids)[which] is not None:
            at.append(i)
            group.append(seen.setdefault(id(rules), (len(seen), rules))[0])
    return at, group, [_on(rules, device) for _, rules in seen.values()]


def _on(rules: TokenRules, device) -> tuple:
    """The rules' three tensors on `device`, copied there once per request (kept with its params)."""
    if str(device) not in rules.on_device:
        rules.on_device[str(device)] = tuple(None if t is None else t.to(device)
                                             for t in (rules.bias_ids, rules.bias_values, rules.allowed_ids))
    return rules.on_device[str(device)]


def _dense(ids: list[torch.Tensor], values, logits: torch.Tensor) -> torch.Tensor:
    """[len(ids), V] of `values`' dtype (bool for True): request g's `ids` set to its values, zero elsewhere;
    ids past the logit rows (an EOS id of a padded vocabulary) land in an extra column, dropped."""
    width, device = logits.shape[-1], logits.device
    dtype = torch.bool if values is True else values.dtype
    dense = torch.zeros(len(ids), width + 1, dtype=dtype, device=device)
    owner = torch.repeat_interleave(torch.arange(len(ids), device=device),
                                    torch.tensor([len(t) for t in ids], device=device))
    dense[owner, torch.cat(ids).clamp(max=width)] = values
    return dense[:, :width]


def _bad_words(logits, rows, _eos) -> None:
    """A word's last token is forbidden where the output ends with the rest of it. vLLM's rule: the
    output tokens only (transformers' bad_words_ids also looks back into the prompt)."""
    pairs = []
    for i, r in enumerate(rows):
        out = r.output_token_ids
        for word in r.params.bad_words_token_ids or ():
            head = word[:-1]
            if len(head) <= len(out) and (not head or out[len(out) - len(head):] == head):
                pairs.append((i, word[-1]))
    _forbid(logits, pairs)


def _min_tokens(logits, rows, eos_token_ids) -> None:
    """Before min_tokens outputs, no EOS and no stop token id can end the sequence."""
    _forbid(logits, [(i, t) for i, r in enumerate(rows) if len(r.output_token_ids) < r.params.min_tokens
                     for t in set(eos_token_ids) | set(r.params.stop_token_ids)])


def _repetition_penalty(logits, rows, _eos) -> None:
    """transformers' rule: a token seen in the prompt or the output has its logit divided by the
    penalty when positive, multiplied when negative (both push it down for a penalty > 1)."""
    idx = [i for i, r in enumerate(rows) if r.params.repetition_penalty != 1.0]
    if not idx:
        return
    seen = _token_counts([rows[i].prompt_token_ids + rows[i].output_token_ids for i in idx], logits.shape[-1],
                         logits.device) > 0
    penalty = torch.tensor([rows[i].params.repetition_penalty for i in idx], device=logits.device)[:, None]
    at = torch.tensor(idx, device=logits.device)
    part = logits[at]
    logits[at] = torch.where(seen, torch.where(part < 0, part * penalty, part / penalty), part)


def _presence_frequency_penalties(logits, rows, _eos) -> None:
    """OpenAI's definition over output tokens: logit -= count * frequency_penalty + (count > 0) * presence_penalty."""
    idx = [i for i, r in enumerate(rows) if r.params.presence_penalty or r.params.frequency_penalty]
    if not idx:
        return
    counts = _token_counts([rows[i].output_token_ids for i in idx], logits.shape[-1], logits.device)
    presence = torch.tensor([rows[i].params.presence_penalty for i in idx], device=logits.device)[:, None]
    frequency = torch.tensor([rows[i].params.frequency_penalty for i in idx], device=logits.device)[:, None]
    at = torch.tensor(idx, device=logits.device)
    logits[at] -= counts * frequency + (counts > 0) * presence


def resolve_token_rules(params: SamplingParams, tokenizer, vocab_size: int) -> SamplingParams:
    """The rules' token ids checked against the vocabulary, and bad_words tokenized (on a copy of the
    params: the caller's object may be shared by prompts of other engines). Raises ValueError."""
    rules = params.compact_token_rules()
    for name, ids in (("logit_bias", rules.bias_ids), ("allowed_token_ids", rules.allowed_ids)):
        if ids is not None and (top := int(ids.max())) >= vocab_size:
            raise ValueError(f"SamplingParams.{name} has token id {top}: the vocabulary has {vocab_size} tokens")
    if not params.bad_words:
        return params
    params = copy.copy(params)
    params.bad_words_token_ids = bad_words_token_ids(tokenizer, params.bad_words)
    return params


def bad_words_token_ids(tokenizer, words: list[str]) -> list[list[int]]:
    """Each word as token ids, spelled as it stands and with one leading space (a word mid-sentence
    is usually its own token with the space): both spellings are forbidden, as in vLLM."""
    out = []
    for word in words:
        for text in (word.lstrip(), " " + word.lstrip()):
            ids = tokenizer.encode(text, add_special_tokens=False)
            if ids and ids not in out:
                out.append(ids)
    return out
