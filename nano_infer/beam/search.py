"""Chapter 11: one request's beam search as plain bookkeeping: candidates in, next beams out.

Every round, each live beam offers its most likely next tokens (`offer`); when all of them have,
`select` ranks every (beam, token) by cumulative log-probability and keeps transformers' rules:

- the best max(2, 1 + number of EOS ids) x k candidates are kept, so at least k of them do not end;
- a candidate that ends (EOS, or the length limit) becomes a finished hypothesis only if it ranks
  in the top k, scored cum_logprob / generated_tokens ** length_penalty; the k best are kept;
- the next beams are the k best candidates that do not end, ranked by raw cumulative log-probability;
- the search stops at the length limit, or early (`early_stopping`) once k hypotheses are finished
  and the best running beam cannot beat the worst of them.

The arithmetic is float32 and in the same order as transformers' `_beam_search`, so the same
logits give the same beams. Nothing here touches KV memory: the plug-in (plugin.py) turns the
choice into forks and frees.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..core.sequence import Sequence
from .params import BeamSearchParams


def num_candidates(beam_width: int, num_eos_ids: int) -> int:
    """Candidates kept per round: enough that k remain after every EOS one is set aside."""
    return max(2, 1 + num_eos_ids) * beam_width


def length_penalised(cum_logprobs: list[float], num_tokens: int, length_penalty: float) -> list[float]:
    """The score a finished hypothesis is ranked by (float32, as transformers divides)."""
    return (torch.tensor(cum_logprobs, dtype=torch.float32) / (num_tokens**length_penalty)).tolist()


@dataclass(eq=False)
class Beam:
    seq: Sequence  # the engine's sequence of this beam
    cum_logprob: float = 0.0  # a float32 value
    token: int | None = None  # the token this beam was extended by in the last round


@dataclass
class Hypothesis:
    output_token_ids: list[int]  # the generated tokens, a final EOS included
    cum_logprob: float
    score: float
    finish_reason: str  # "stop" (EOS) or "length"


@dataclass(eq=False)
class Candidate:
    parent: Beam
    token: int
    cum_logprob: float
    ends: bool = False


@dataclass(eq=False)
class BeamState:
    params: BeamSearchParams
    eos_token_ids: frozenset[int]  # empty with ignore_eos
    max_new_tokens: int  # the length limit: max_tokens, or what the model's length leaves
    beams: list[Beam] = field(default_factory=list)  # live, best first
    finished: list[Hypothesis] = field(default_factory=list)  # best first, at most k
    num_generated: int = 0  # rounds done: every live beam has this many output tokens
    done: bool = False
    # this round's offer of each beam: (its top logprobs, their token ids)
    offers: dict[Sequence, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    num_preemptions: int = 0  # of beams pruned so far (the request reports all of them)

    @classmethod
    def start(cls, params: BeamSearchParams, seq: Sequence, eos_token_ids: set[int], max_new_tokens: int) -> BeamState:
        eos = frozenset() if params.ignore_eos else frozenset(eos_token_ids)
        return cls(params, eos, max_new_tokens, beams=[Beam(seq)])

    @property
    def width(self) -> int:
        return self.params.beam_width

    @property
    def num_candidates(self) -> int:
        return num_candidates(self.width, len(self.eos_token_ids))

    def offer(self, seq: Sequence, logprobs: torch.Tensor, token_ids: torch.Tensor) -> None:
        """A beam's best next tokens (at least `num_candidates`, best first) and their log-probabilities."""
        self.offers[seq] = (logprobs, token_ids)

    @property
    def ready(self) -> bool:
        """Every live beam has offered: the round can be decided."""
        return all(b.seq in self.offers for b in self.beams)

    def candidates(self) -> list[Candidate]:
        """All beams' offers ranked by cumulative log-probability, the best `num_candidates`."""
        logprobs = torch.stack([self.offers[b.seq][0][: self.num_candidates] for b in self.beams])
        token_ids = torch.stack([self.offers[b.seq][1][: self.num_candidates] for b in self.beams])
        cum = torch.tensor([b.cum_logprob for b in self.beams], dtype=torch.float32)
        totals = (logprobs.float() + cum[:, None]).flatten()
        order = torch.sort(totals, descending=True, stable=True).indices[: self.num_candidates].tolist()
        width, tokens, totals = logprobs.shape[1], token_ids.flatten().tolist(), totals.tolist()
        at_limit = self.num_generated + 1 >= self.max_new_tokens
        return [Candidate(self.beams[i // width], tokens[i], totals[i], at_limit or tokens[i] in self.eos_token_ids)
                for i in order]

    def select(self) -> list[Candidate]:
        """Decide the round: new finished hypotheses, the next beams (returned, best first), whether to stop."""
        ranked = self.candidates()
        self.offers = {}
        self.num_generated += 1
        self._finish([c for c in ranked[: self.width] if c.ends])
        kept = [c for c in ranked if not c.ends][: self.width]
        self.beams = [Beam(c.parent.seq, c.cum_logprob, c.token) for c in kept]
        # a width of 1 stops at its first hypothesis: greedy decoding (transformers' num_beams=1 runs greedy search)
        stop_when_full = self.params.early_stopping is True or self.width == 1
        self.done = not kept or (stop_when_full and len(self.finished) == self.width) or self._cannot_improve()
        return kept

    def _finish(self, ended: list[Candidate]) -> None:
        if not ended:
            return
        scores = length_penalised([c.cum_logprob for c in ended], self.num_generated, self.params.length_penalty)
        new = [Hypothesis(list(c.parent.seq.output_token_ids) + [c.token], c.cum_logprob, s,
                          "stop" if c.token in self.eos_token_ids else "length")
               for c, s in zip(ended, scores)]
        self.finished = sorted(self.finished + new, key=lambda h: -h.score)[: self.width]  # stable: earlier first

    def _cannot_improve(self) -> bool:
        """transformers' early-stop heuristic: could the best running beam still beat the worst finished one?"""
        if len(self.finished) < self.width:
            return False
        lp = self.params.length_penalty
        length = self.max_new_tokens if self.params.early_stopping == "never" and lp > 0 else self.num_generated
        best = length_penalised([self.beams[0].cum_logprob], length, lp)[0]
        return not best > min(h.score for h in self.finished)
