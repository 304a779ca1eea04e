"""Rejection sampling is exact: the tokens that come out follow the target's distribution, whatever
the draft. Checked with a chi-square test on a 5-token vocabulary, and shown able to fail: the same
check rejects three planted wrong acceptance rules."""
import pytest
import torch

from nano_infer.spec import accept_sampled

V = 5
TRIALS = 4_000


def markov(seed, sharp):
    """Next-token table: row i is the distribution after token i."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(V, V, generator=g) * sharp).softmax(-1)


P = markov(0, 1.5)  # the target
Q = markov(1, 1.0)  # a draft that disagrees with it


def generate_two(rule, draft, k, gen, start=0):
    """Two tokens after `start` from the target P, produced by speculative rounds: propose k
    tokens (from the draft chain Q, or a fixed n-gram guess), verify with `rule`, repeat."""
    out, last = [], start
    while len(out) < 2:
        if draft == "model":
            proposal, q_rows, prev = [], [], last
            for _ in range(k):
                d = int(torch.multinomial(Q[prev], 1, generator=gen))
                proposal.append(d)
                q_rows.append(Q[prev])
                prev = d
            q = torch.stack(q_rows)
        else:  # n-gram: a deterministic guess, q is a point mass
            proposal, q = [(last + 1 + j) % V for j in range(k)], None
        p = torch.stack([P[t] for t in [last] + proposal])
        tokens = rule(p, proposal, q, gen)
        out += tokens
        last = out[-1]
    return out[:2]


def chi_square_p_value(rule, draft, k, seed=0) -> float:
    """p-value of 'the pairs (t1, t2) follow P[start][t1] * P[t1][t2]' over TRIALS runs."""
    gen = torch.Generator().manual_seed(seed)
    counts = torch.zeros(V, V)
    for _ in range(TRIALS):
        t1, t2 = generate_two(rule, draft, k, gen)
        counts[t1, t2] += 1
    expected = TRIALS * P[0][:, None] * P
    stat = ((counts - expected) ** 2 / expected).sum()
    df = V * V - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2), stat / 2))


# -- planted wrong rules ------------------------------------------------------------------------
def wrong_ratio(p, proposal, q, gen):
    """Accepts with min(1, q/p): the ratio upside down (residual and bonus as they should be)."""
    for j, d in enumerate(proposal):
        if float(torch.rand(1, generator=gen)) * p[j, d] >= q[j, d]:
            residual = (p[j] - q[j]).clamp(min=0)
            return proposal[:j] + [int(torch.multinomial(residual / residual.sum(), 1, generator=gen))]
    return proposal + [int(torch.multinomial(p[len(proposal)], 1, generator=gen))]


def wrong_residual(p, proposal, q, gen):
    """Correct acceptance, but a rejected position is redrawn from p, not from max(0, p - q)."""
    k = len(proposal)
    d = torch.tensor(proposal)
    p_d = p[torch.arange(k), d]
    q_d = torch.ones(k) if q is None else q[torch.arange(k), d]
    for j in range(k):
        if float(torch.rand(1, generator=gen)) * q_d[j] >= p_d[j]:
            return proposal[:j] + [int(torch.multinomial(p[j], 1, generator=gen))]
    return proposal + [int(torch.multinomial(p[k], 1, generator=gen))]


def wrong_accept_all(p, proposal, q, gen):
    """Trusts the draft: keeps every proposal."""
    return proposal + [int(torch.multinomial(p[len(proposal)], 1, generator=gen))]


@pytest.mark.parametrize("draft, k", [("model", 1), ("model", 3), ("ngram", 2)])
def test_accepted_tokens_follow_the_target_distribution(draft, k):
    assert chi_square_p_value(accept_sampled, draft, k) > 1e-3


@pytest.mark.parametrize("rule", [wrong_ratio, wrong_residual, wrong_accept_all], ids=lambda r: r.__name__)
def test_the_check_rejects_a_wrong_acceptance_rule(rule):
    draft = "ngram" if rule is wrong_residual else "model"  # the residual matters most against a point mass
    assert chi_square_p_value(rule, draft, 2) < 1e-6
