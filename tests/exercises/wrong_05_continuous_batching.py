"""Planted wrong answers for chapter 05."""


def schedule_step__waiting_before_running(running, waiting, token_budget, max_num_seqs):
    out, budget, seats = [], token_budget, len(running)
    for rid, left in waiting:
        if budget == 0 or seats >= max_num_seqs:
            break
        out.append((rid, min(left, budget)))
        budget -= min(left, budget)
        seats += 1
    for rid, left in running:
        if budget == 0:
            break
        out.append((rid, min(left, budget)))
        budget -= min(left, budget)
    return out


def schedule_step__ignores_max_num_seqs(running, waiting, token_budget, max_num_seqs):
    out, budget = [], token_budget
    for rid, left in running + waiting:
        if budget == 0:
            break
        out.append((rid, min(left, budget)))
        budget -= min(left, budget)
    return out


def schedule_step__no_chunking(running, waiting, token_budget, max_num_seqs):
    out, budget, seats = [], token_budget, len(running)
    for rid, left in running:
        if left <= budget:
            out.append((rid, left))
            budget -= left
    for rid, left in waiting:
        if seats >= max_num_seqs or left > budget:  # a long prompt waits for a budget it may never get
            break
        out.append((rid, left))
        budget -= left
        seats += 1
    return out


def _match(prompt, cached):
    best = 0
    for c in cached:
        n = 0
        while n < min(len(prompt), len(c)) and prompt[n] == c[n]:
            n += 1
        best = max(best, n)
    return best


def lpm_order__token_level_match(prompts, cached, block_size):
    return sorted(range(len(prompts)), key=lambda i: -_match(prompts[i], cached))


def lpm_order__last_arrival_first_among_ties(prompts, cached, block_size):
    return sorted(range(len(prompts)), key=lambda i: (-(_match(prompts[i], cached) // block_size), -i))
