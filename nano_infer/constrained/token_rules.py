"""SamplingParams' logit_bias and allowed_token_ids as tensors, made once per request.

A rule is read by every sample and every step of its request (and by each position a speculative
verify scores), so it is made into tensors once, when the params are checked: a step then applies
it with one scatter whatever its size (engine/logits_processors.py), rather than turning a Python
list into a tensor per row per step, and its memory goes when the request's params do.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

MAX_LOGIT_BIAS = 100.0  # OpenAI's range is [-100, 100]; vLLM clamps to it too
# each id is a tensor element of its request, made once: a list is capped all the same
MAX_TOKEN_RULES = 2**18  # logit_bias entries, allowed_token_ids (a 262k vocabulary fits)


@dataclass
class TokenRules:
    """The tensors of one SamplingParams' two fields (None where a field is off)."""

    bias_ids: torch.Tensor | None = None  # int64, each id once (a dict's keys)
    bias_values: torch.Tensor | None = None  # float32, clamped to +-MAX_LOGIT_BIAS
    allowed_ids: torch.Tensor | None = None  # int64, as given (an id twice is allowed twice: no sort needed)
    sources: tuple = (None, None)  # the logit_bias and allowed_token_ids objects they were made from
    on_device: dict = field(default_factory=dict, repr=False)  # device -> the three tensors there, copied once


def build_token_rules(logit_bias, allowed_token_ids, bad) -> TokenRules:
    """The two fields checked (`bad(name, value, what it must be)` raises) and made tensors. The rules'
    source for logit_bias is a new dict, clamped: SamplingParams keeps it as its field."""
    bias_ids = values = allowed = None
    if logit_bias is not None:
        keys = list(logit_bias) if isinstance(logit_bias, dict) and len(logit_bias) <= MAX_TOKEN_RULES else None
        if keys is not None:
            bias_ids = _tensor(keys, (int,), torch.int64)
            values = _tensor(list(logit_bias.values()), (int, float), torch.float64)
        if bias_ids is None or values is None or (keys and (bias_ids.min() < 0 or not values.isfinite().all())):
            bad("logit_bias", logit_bias, f"a dict of at most {MAX_TOKEN_RULES} token ids >= 0 to finite numbers")
        values = values.clamp(-MAX_LOGIT_BIAS, MAX_LOGIT_BIAS)
        logit_bias = dict(zip(keys, values.tolist()))
        bias_ids, values = (bias_ids, values.float()) if keys else (None, None)
    if allowed_token_ids is not None:
        if isinstance(allowed_token_ids, list) and 0 < len(allowed_token_ids) <= MAX_TOKEN_RULES:
            allowed = _tensor(allowed_token_ids, (int,), torch.int64)
        if allowed is None or allowed.min() < 0:
            bad("allowed_token_ids", allowed_token_ids, f"a non-empty list of at most {MAX_TOKEN_RULES} token ids >= 0")
    return TokenRules(bias_ids, values, allowed, (logit_bias, allowed_token_ids))


def _tensor(items: list, kinds: tuple, dtype: torch.dtype) -> torch.Tensor | None:
    """`items` as one tensor if each is one of `kinds` (a bool is not an int here) and fits `dtype`, else
    None. The usual lists are checked by mapping `type` over them at C speed: 2**18 ids, no Python loop."""
    if not set(map(type, items)) <= set(kinds):  # else a subclass (an IntEnum, a numpy float), looked at one by one
        if not all(isinstance(x, kinds) and not isinstance(x, bool) for x in items):
            return None
    try:
        return torch.tensor(items, dtype=dtype)
    except (OverflowError, RuntimeError, TypeError, ValueError):  # an int past 64 bits
        return None
