"""Chapter 05, reference solutions: `check.schedule_step`, `check.lpm_order`."""


def schedule_step(running: list[tuple[str, int]], waiting: list[tuple[str, int]],
                  token_budget: int, max_num_seqs: int) -> list[tuple[str, int]]:
    """One step: (request id, tokens to compute) for each scheduled request, in order.

    running / waiting: (request id, tokens still to compute), running in admission order,
    waiting in arrival order. Running requests go first; then waiting ones are admitted while
    budget is left and fewer than max_num_seqs requests run. Each gets as many tokens as it
    needs, or what is left of the budget (chunked prefill).
    """
    out, budget = [], token_budget
    for rid, left in running:
        if budget == 0:
            break
        n = min(left, budget)
        out.append((rid, n))
        budget -= n
    seats = len(running)
    for rid, left in waiting:
        if budget == 0 or seats >= max_num_seqs:
            break
        n = min(left, budget)
        out.append((rid, n))
        budget -= n
        seats += 1
    return out


def lpm_order(prompts: list[list[int]], cached: list[list[int]], block_size: int) -> list[int]:
    """Indices of `prompts`, longest cached prefix first (whole blocks of block_size); ties keep arrival order."""
    def match(prompt):
        best = 0
        for c in cached:
            n = 0
            while n < min(len(prompt), len(c)) and prompt[n] == c[n]:
                n += 1
            best = max(best, n)
        return best // block_size * block_size

    return sorted(range(len(prompts)), key=lambda i: -match(prompts[i]))  # sorted() is stable
