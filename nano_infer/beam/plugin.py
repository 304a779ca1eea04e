"""BeamSearcher: beam search inside the engine, a plug-in beside the step loop.

A beam request is one Request whose sequences are its live beams, scheduled like any others
(continuous batching next to ordinary requests, chunked prefill, prefix caching, preemption).
The plug-in claims the logit row each beam produces and keeps its best tokens as the beam's
offer. Once every live beam of the request has offered, it decides the round (search.py) and
carries it out on the KV memory: a beam extended twice forks (the child reads the parent's
blocks, reference counts go up, the first write into the shared last block copies it), a beam
nobody extends finishes and gives its blocks back, a beam extended once appends its token.

A beam that has offered has nothing to compute until its siblings have offered too, and the
scheduler skips it; so beams split across steps by the token budget, or one preempted and
recomputed, still decide each round together, on the same logits they would have had in one step.
"""
from __future__ import annotations

import time

import torch

from ..engine.plugin import EnginePlugin
from ..engine.sequence import Sequence, SequenceStatus


class BeamSearcher(EnginePlugin):
    """The engine makes it on its first beam-search request: an engine that never searches asks nothing of it."""

    def __init__(self, requests: dict, scheduler, tokenizer, device):
        self.requests = requests  # the engine's table of live requests, shared
        self.scheduler = scheduler
        self.tokenizer = tokenizer
        self.device = device

    def claims(self, entry) -> bool:
        return self.requests[entry.seq.request_id].beam is not None and entry.num_sample_rows > 0

    def process(self, claimed: list, logits: torch.Tensor, outputs) -> None:
        """Each claimed beam offers its best tokens; requests whose beams have all offered decide the round."""
        states = [self.requests[entry.seq.request_id].beam for entry, _ in claimed]
        scores = logits[[row for _, row in claimed]].float()
        scales = [s.params.scale or 1.0 for s in states]
        if any(x != 1.0 for x in scales):
            scores = scores / torch.tensor(scales, device=scores.device)[:, None]
        top = torch.topk(torch.log_softmax(scores, dim=-1), min(max(s.num_candidates for s in states), scores.shape[-1]))
        values, indices = top.values.cpu(), top.indices.cpu()
        ready = {}
        for i, (entry, _) in enumerate(claimed):
            self.scheduler.advance(entry.seq, entry.end)
            states[i].offer(entry.seq, values[i], indices[i])
            if states[i].ready:
                ready[entry.seq.request_id] = entry.seq
        for seq in ready.values():
            outputs.isolated(seq, self.advance, self.requests[seq.request_id], outputs)

    def advance(self, req, outputs) -> None:
        """One round of `req`: select, then fork, append and free on the sequences (or end the request)."""
        state = req.beam
        parents = [b.seq for b in state.beams]
        state.select()
        self._count(req, outputs, len(state.beams) or len(state.finished))
        for seq in parents:
            seq.num_pending_forks = 0  # the seats kept since admission are filled now
        if state.done:
            for seq in parents:
                self.scheduler.finish(seq, "length")
            req.seqs = [self._hypothesis(req, i, h) for i, h in enumerate(state.finished)]
            req.seqs[0].num_preemptions = state.num_preemptions + sum(s.num_preemptions for s in parents)
            return
        extended = set()
        for beam in state.beams:  # forks first, while every parent still holds the tokens it offered from
            if beam.seq in extended:
                beam.seq = self._fork(req, beam.seq)
            extended.add(beam.seq)
        for rank, beam in enumerate(state.beams):
            beam.seq.token_ids.append(beam.token)
            beam.seq.index = rank
        for seq in parents:
            if seq not in extended:
                self.scheduler.finish(seq, "pruned")
                state.num_preemptions += seq.num_preemptions  # the request's count outlives its beams
        req.seqs = [b.seq for b in state.beams]

    def _fork(self, req, parent: Sequence) -> Sequence:
        child = req.new_sequence(parent.index, self.device, self.tokenizer, parent)
        self.scheduler.fork(parent, child)
        return child

    @staticmethod
    def _count(req, outputs, num_tokens: int) -> None:
        now = time.perf_counter()
        outputs.num_generated_tokens += num_tokens
        if req.metrics.first_token_time is None:
            req.metrics.first_token_time = now
            req.metrics.num_cached_tokens = req.seqs[0].num_cached_tokens
        req.metrics.token_times.append(now)

    @staticmethod
    def _hypothesis(req, index: int, h) -> Sequence:
        """A finished hypothesis as a finished sequence, so the request's output is built as any other's."""
        return Sequence(req.request_id, list(req.prompt_token_ids), req.params, index=index,
                        token_ids=list(req.prompt_token_ids) + h.output_token_ids, status=SequenceStatus.FINISHED,
                        finish_reason=h.finish_reason, cumulative_logprob=h.cum_logprob)
