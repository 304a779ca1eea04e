"""Chapter 11, reference solutions: `check.next_beams`, `check.hypothesis_score`, `check.fork_and_free`."""


def next_beams(candidates: list[tuple[int, int, float]], k: int, eos_ids: set[int]):
    """candidates: (beam index, token, cumulative log-prob), best first. Returns (next beams, newly finished),
    each a list of candidates, best first."""
    finished = [c for c in candidates[:k] if c[1] in eos_ids]  # an EOS counts only among the top k
    beams = [c for c in candidates if c[1] not in eos_ids][:k]
    return beams, finished


def hypothesis_score(cum_logprob: float, num_prompt_tokens: int, num_output_tokens: int, length_penalty: float) -> float:
    """transformers' score of a finished hypothesis: the generated tokens (its EOS included) count, the prompt does not."""
    return cum_logprob / num_output_tokens**length_penalty


def fork_and_free(block_tables: dict[int, list[int]], extends: list[int]):
    """block_tables: the live beams' tables (seq id -> blocks); extends: for each next beam, best first, the seq id
    of the beam it extends. Returns (parents to fork, one per fork, in order; pruned seq ids; freed block ids)."""
    seen, forks = set(), []
    for seq_id in extends:
        if seq_id in seen:  # the first extension appends in place; each further one is a new sequence
            forks.append(seq_id)
        seen.add(seq_id)
    pruned = sorted(set(block_tables) - seen)
    kept = {b for s in seen for b in block_tables[s]}  # forks only add references to these
    freed = sorted({b for s in pruned for b in block_tables[s]} - kept)
    return forks, pruned, freed
