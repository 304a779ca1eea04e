"""BeamSearcher: beam search inside the engine, a plug-in beside the step loop.

A beam request is one Request whose sequences are its live beams, scheduled like any others
(continuous batching next to ordinary requests, chunked prefill, prefix caching, preemption).
The plug-in serves the requests whose parameters are `BeamSearchParams`, keeps each one's
`BeamState` (its own record, by request id), claims the logit row each beam produces and keeps
its best tokens as the beam's offer. Once every live beam of the request has offered, it decides
the round (search.py) and carries it out on the sequences: a beam extended twice forks (the child
reads the parent's blocks, reference counts go up, the first write into the shared last block
copies it), a beam nobody extends finishes and gives its blocks back, a beam extended once
appends its token.

A beam that has offered has nothing to compute until its siblings have offered too, and the
scheduler skips it; so beams split across steps by the token budget, or one preempted and
recomputed, still decide each round together, on the same logits they would have had in one step.
"""
from __future__ import annotations

import time

import torch

from ..core.batch import ScheduledSeq
from ..core.plugin import Sequences
from ..core.request import Request
from ..core.sequence import SamplingState, Sequence, SequenceStatus
from ..core.utils import cdiv
from ..engine.build import Feature, FeatureSetup, register_feature
from ..engine.model_runner import ModelRunner
from ..kv.manager import KVManager
from ..sampling_params import BeamSearchParams, SamplingParams
from .search import BeamState, Hypothesis


@register_feature
class BeamSearcher(Feature[BeamSearchParams]):
    serves = BeamSearchParams

    def __init__(self, setup: FeatureSetup):
        self.config = setup.config
        self.eos_token_ids = setup.eos_token_ids
        self.max_model_len = setup.max_model_len
        self.kv: KVManager | None = None
        self.searches: dict[str, tuple[Request, BeamState]] = {}  # the requests it serves, by id

    @classmethod
    def create(cls, setup: FeatureSetup) -> BeamSearcher:
        return cls(setup)  # always on: it costs nothing until a beam-search request comes

    def attach(self, runner: ModelRunner, kv: KVManager | None) -> None:
        self.kv = kv

    # -- its requests ----------------------------------------------------------------------------
    def sampling_params(self, params: BeamSearchParams) -> SamplingParams:
        return params.sampling_params()

    def check(self, params: BeamSearchParams, num_prompt_tokens: int, max_tokens: int) -> None:
        """Beams fork onto shared blocks, all `beam_width` of them live at once, and decide each round
        from their own logits: what that rules out is refused before anything runs."""
        k, cfg = params.beam_width, self.config
        if cfg.kv_cache == "contiguous":
            raise ValueError("beam search forks beams onto shared KV blocks: it needs kv_cache='paged' (or 'none'), "
                             "not 'contiguous'")
        if cfg.speculative_config is not None:
            raise ValueError("beam search with speculative decoding is not supported: a speculative verify accepts one "
                             "continuation per sequence, beam search keeps beam_width of them")
        if k > cfg.max_num_seqs:
            raise ValueError(f"beam_width={k} beams run side by side, but max_num_seqs={cfg.max_num_seqs}")
        if self.kv is not None:  # paged: "contiguous" was refused above, "none" has no pool
            bs = self.kv.block_size
            shared = num_prompt_tokens // bs
            own = cdiv(num_prompt_tokens + max_tokens, bs) - shared
            if shared + k * own > self.kv.num_blocks:
                raise ValueError(f"beam_width={k} beams of up to {num_prompt_tokens + max_tokens} tokens need up to "
                                 f"{shared + k * own} KV blocks but the pool has {self.kv.num_blocks}; lower "
                                 f"beam_width or max_tokens, or give the cache more memory")

    def add(self, req: Request, params: BeamSearchParams, max_tokens: int) -> None:
        self.searches[req.request_id] = (req, BeamState.start(params, req.seqs[0], self.eos_token_ids, max_tokens))

    def release(self, request_id: str) -> None:
        self.searches.pop(request_id, None)

    # -- each step -------------------------------------------------------------------------------
    def claims(self, entry: ScheduledSeq) -> bool:
        return entry.seq.request_id in self.searches and entry.num_sample_rows > 0

    def process(self, claimed: list[tuple[ScheduledSeq, int]], logits: torch.Tensor, seqs: Sequences) -> None:
        """Each claimed beam offers its best tokens; requests whose beams have all offered decide the round."""
        states = [self.searches[entry.seq.request_id][1] for entry, _ in claimed]
        scores = logits[[row for _, row in claimed]].float()
        scales = [s.params.scale or 1.0 for s in states]
        if any(x != 1.0 for x in scales):
            scores = scores / torch.tensor(scales, device=scores.device)[:, None]
        top = torch.topk(torch.log_softmax(scores, dim=-1), min(max(s.num_candidates for s in states), scores.shape[-1]))
        values, indices = top.values.cpu(), top.indices.cpu()
        ready = {}
        for i, (entry, _) in enumerate(claimed):
            seqs.advance(entry.seq, entry.end)
            states[i].offer(entry.seq, values[i], indices[i])
            if states[i].ready:
                ready[entry.seq.request_id] = entry.seq
        for seq in ready.values():
            seqs.isolated(seq, self.advance, *self.searches[seq.request_id], seqs)

    def advance(self, req: Request, state: BeamState, seqs: Sequences) -> None:
        """One round of `req`: select, then fork, append and free on the sequences (or end the request)."""
        parents = [b.seq for b in state.beams]
        state.select()
        seqs.record_tokens(req, len(state.beams) or len(state.finished), time.perf_counter())
        for seq in parents:
            seq.num_pending_forks = 0  # the seats kept since admission are filled now
        if state.done:
            for seq in parents:
                seqs.finish(seq, "length")
            req.seqs = [self._hypothesis(req, i, h) for i, h in enumerate(state.finished)]
            req.seqs[0].num_preemptions = state.num_preemptions + sum(s.num_preemptions for s in parents)
            return
        extended = set()
        for beam in state.beams:  # forks first, while every parent still holds the tokens it offered from
            if beam.seq in extended:
                beam.seq = seqs.fork(beam.seq)
            extended.add(beam.seq)
        for rank, beam in enumerate(state.beams):
            beam.seq.token_ids.append(beam.token)
            beam.seq.index = rank
        for seq in parents:
            if seq not in extended:
                seqs.finish(seq, "pruned")
                state.num_preemptions += seq.num_preemptions  # the request's count outlives its beams
        req.seqs = [b.seq for b in state.beams]

    @staticmethod
    def _hypothesis(req: Request, index: int, h: Hypothesis) -> Sequence:
        """A finished hypothesis as a finished sequence, so the request's output is built as any other's."""
        return Sequence(req.request_id, list(req.prompt_token_ids), req.params, index=index,
                        token_ids=list(req.prompt_token_ids) + h.output_token_ids,
                        status=SequenceStatus.finished(h.finish_reason),
                        sampling=SamplingState(cumulative_logprob=h.cum_logprob))
