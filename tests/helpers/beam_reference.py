"""transformers' beam search as the oracle: `generate(num_beams=k, num_return_sequences=k, do_sample=False)`."""
import torch


def hf_beams(model, prompt_ids: list[int], params, eos_token_ids, pad_token_id: int) -> tuple[list[list[int]], list[float]]:
    """The k hypotheses (prompt + output, best first) and their scores; width 1 is greedy search.

    Every setting a generation_config.json could switch on (sampling, penalties, top-k/p) is
    passed explicitly, so only beam search decides the tokens.
    """
    k = params.beam_width
    eos = None if params.ignore_eos else sorted(eos_token_ids)
    ids = torch.tensor([prompt_ids])
    extra = {}
    if params.temperature > 0:  # scores are log_softmax(logits / t): a processor on transformers' log-probs
        t = params.temperature
        extra["logits_processor"] = [lambda _, scores: torch.log_softmax(scores / t, dim=-1)]
    with torch.no_grad():
        g = model.generate(ids, attention_mask=torch.ones_like(ids), num_beams=k, num_return_sequences=k,
                           do_sample=False, max_new_tokens=params.max_tokens, length_penalty=params.length_penalty,
                           early_stopping=params.early_stopping, eos_token_id=eos, pad_token_id=pad_token_id,
                           return_dict_in_generate=True, output_scores=True, temperature=None, top_k=None,
                           top_p=None, repetition_penalty=None, no_repeat_ngram_size=None, min_new_tokens=None,
                           **extra)
    n = len(prompt_ids)
    if k == 1:
        seq = g.sequences[0].tolist()
        return [seq], [float("nan")]
    lengths = [n + int((g.beam_indices[i] >= 0).sum()) for i in range(k)]
    return [g.sequences[i].tolist()[:m] for i, m in enumerate(lengths)], g.sequences_scores.tolist()
