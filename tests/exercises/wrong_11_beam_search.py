"""Planted wrong answers for chapter 11."""


def next_beams__finishes_eos_from_all_candidates(candidates, k, eos_ids):
    finished = [c for c in candidates if c[1] in eos_ids]  # vLLM's rule, not transformers'
    return [c for c in candidates if c[1] not in eos_ids][:k], finished


def next_beams__forgets_eos(candidates, k, eos_ids):
    return candidates[:k], []


def next_beams__beams_only_from_the_top_k(candidates, k, eos_ids):
    top = candidates[:k]
    return [c for c in top if c[1] not in eos_ids], [c for c in top if c[1] in eos_ids]


def hypothesis_score__divides_by_prompt_and_output(cum_logprob, num_prompt_tokens, num_output_tokens, length_penalty):
    return cum_logprob / (num_prompt_tokens + num_output_tokens) ** length_penalty


def hypothesis_score__eos_not_counted(cum_logprob, num_prompt_tokens, num_output_tokens, length_penalty):
    return cum_logprob / max(1, num_output_tokens - 1) ** length_penalty


def hypothesis_score__penalty_as_a_factor(cum_logprob, num_prompt_tokens, num_output_tokens, length_penalty):
    return cum_logprob / num_output_tokens * length_penalty


def fork_and_free__frees_parents_still_extended(block_tables, extends):
    forks = list(extends)  # every next beam a fresh fork, every parent freed
    pruned = sorted(block_tables)
    freed = sorted({b for t in block_tables.values() for b in t} - {b for s in extends for b in block_tables[s]})
    return forks, pruned, freed


def fork_and_free__one_fork_per_parent(block_tables, extends):
    forks = sorted({s for s in extends if extends.count(s) > 1}, key=extends.index)
    pruned = sorted(set(block_tables) - set(extends))
    kept = {b for s in extends for b in block_tables[s]}
    return forks, pruned, sorted({b for s in pruned for b in block_tables[s]} - kept)


def fork_and_free__frees_every_block_of_a_pruned_beam(block_tables, extends):
    seen, forks = set(), []
    for s in extends:
        if s in seen:
            forks.append(s)
        seen.add(s)
    pruned = sorted(set(block_tables) - seen)
    return forks, pruned, sorted({b for s in pruned for b in block_tables[s]})
