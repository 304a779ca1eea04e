"""How an OpenAI request asks for beam search: vLLM's `use_beam_search: true`, with `n` beams.

The n best hypotheses come back as the n choices of one reply. What beam search cannot honour is
refused with 400 naming the field, as vLLM does for streaming: the hypotheses are only known
when the search ends, a seed or top_p/top_k has nothing to sample, a constraint or stop list
would need every beam checked, and the search keeps no per-token logprobs.
"""
from __future__ import annotations

from .protocol import ProtocolError
from .sampling import LOGITS_RULES, check_unsupported, constraint_fields
from ..beam.params import BeamSearchParams


def beam_search_params(body, max_tokens: int | None, logprobs: int | None,
                       prompt_logprobs: int | None = None) -> BeamSearchParams:
    check_unsupported(body)
    refused = [("stream", body.stream, "streaming with beam search is not supported: the hypotheses are known "
                                       "only when the search ends; send stream: false"),
               ("seed", body.seed is not None, "beam search is deterministic: a seed has no meaning"),
               ("top_p", body.top_p != 1.0, "beam search does not sample: leave top_p out"),
               ("top_k", body.top_k not in (-1, 0), "beam search does not sample: leave top_k out"),
               ("logprobs", logprobs is not None or prompt_logprobs is not None,
                "logprobs are not returned with beam search (each choice carries its hypothesis only)"),
               ("stop", bool(body.stop), "stop strings are not supported with beam search"),
               ("stop_token_ids", bool(body.stop_token_ids), "stop_token_ids are not supported with beam search"),
               ("skip_special_tokens", not body.skip_special_tokens,
                "beam search decodes its text with special tokens skipped")]
    refused += [(name, getattr(body, name) != off, f"{name} is not applied by beam search (vLLM's BeamSearchParams has "
                                                   f"no logits rules); leave it out") for name, off in LOGITS_RULES.items()]
    refused.append(("include_stop_str_in_output", body.include_stop_str_in_output,
                    "stop strings are not supported with beam search"))
    for field, bad, why in refused:
        if bad:
            raise ProtocolError(f"{field}: {why}", param=field)
    if any(c is not None for c in constraint_fields(body)):
        raise ProtocolError("use_beam_search: constrained output is not supported with beam search",
                            param="use_beam_search")
    try:
        return BeamSearchParams(body.n, max_tokens, ignore_eos=body.ignore_eos, temperature=body.temperature,
                                length_penalty=body.length_penalty, early_stopping=body.early_stopping)
    except ValueError as e:
        field = str(e).removeprefix("BeamSearchParams.").split("=", 1)[0]
        raise ProtocolError(str(e).replace("BeamSearchParams.beam_width", "n"),
                            param="n" if field == "beam_width" else field) from e
