"""The speculative decoder: an engine plug-in that proposes, verifies and rolls back.

One step for a decoding sequence:
1. the scheduler reserves k proposal slots past its last token in the token budget and the KV
   pool (`lookahead`, the entry's `num_lookahead`);
2. `adjust` (before the forward pass) fills the entry's `spec_token_ids`, cuts what a
   constraint forbids and gives back the slots it did not use;
3. the runner computes all 1 + k positions in one pass and returns a logit row for each;
4. `process` (this plug-in claims every entry with proposals) keeps the longest accepted
   prefix plus one corrected or bonus token, appends them, and rolls back the blocks that only
   rejected tokens used.
Nothing of a rejected token reaches the prefix cache: caching reads `num_computed_tokens`,
which only ever counts accepted tokens once the step is over. The decoder owns its draft
model, if any; the runner keeps the draft's KV filled without knowing what it is. It is a
feature the engine builds from `speculative_config` (registered below): the draft loads with
the target, and its K/V per token is budgeted with the target's pool.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..config import SpeculativeConfig
from ..core.batch import ScheduledSeq
from ..core.plugin import Phase, Sequences, StepContext
from ..core.sequence import Sequence
from ..engine.build import Feature, FeatureSetup, register_feature
from ..engine.logits_processors import Row, apply_logits_rules
from ..engine.model_runner import ModelRunner
from ..engine.sampling import greedy_tokens
from ..kv.manager import KVManager
from ..kv.quant import kv_bytes_per_token
from .draft import DraftProposer
from .ngram import propose_ngram
from .rejection import accept_greedy, accept_sampled, target_probs


@dataclass
class SpecStats:
    num_drafts: int = 0  # verify passes (one per sequence per step that had proposals)
    num_draft_tokens: int = 0  # tokens proposed and verified
    num_accepted_tokens: int = 0  # of those, accepted
    num_emitted_tokens: int = 0  # tokens appended by verify passes (accepted + corrected/bonus)
    # set to [] to record each verify: (request_id, index, length before, proposal, tokens appended, accepted)
    log: list | None = None

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_tokens_per_verify(self) -> float:
        return self.num_emitted_tokens / self.num_drafts if self.num_drafts else 0.0


@register_feature
class SpeculativeDecoder(Feature[None]):
    phase = Phase.PROPOSE  # after the host tier's copies: a draft reads the blocks they fill

    def __init__(self, config: SpeculativeConfig, max_model_len: int, attention: str,
                 draft: DraftProposer | None = None):
        self.config = config
        self.attention = attention  # the draft's attention backend: the target's kind
        self.draft = draft  # None for n-gram lookup
        self.max_model_len = max_model_len
        self.kv: KVManager | None = None  # proposal slots are allocated and rolled back there
        self.runner: ModelRunner | None = None  # runs the draft on the step's block tables
        self.stats = SpecStats()
        if draft is not None:  # the draft's K/V lives in blocks of the same ids: the pool budgets for both per token
            self.kv_bytes_per_token = kv_bytes_per_token(draft.config.num_hidden_layers, draft.model.num_kv_heads,
                                                         draft.model.head_dim, draft.dtype, draft.kv_cache_dtype)

    @classmethod
    def create(cls, setup: FeatureSetup) -> SpeculativeDecoder | None:
        spec = setup.config.speculative_config
        if spec is None:
            return None
        draft = None if spec.method != "draft_model" else DraftProposer(
            spec.model, setup.hf_config, setup.tokenizer, setup.device, setup.dtype, setup.max_model_len,
            setup.config.kv_cache_dtype)
        return cls(spec, setup.max_model_len, setup.config.attention, draft)

    def attach(self, runner: ModelRunner, kv: KVManager | None) -> None:
        self.kv, self.runner = kv, runner
        if self.draft is not None:
            self.draft.attach(runner, kv.num_blocks, kv.block_size, self.attention)

    def lookahead(self, seq: Sequence) -> int:
        """Proposal slots the scheduler may reserve: k, less near max_tokens or max_model_len
        (a verify appends up to 1 + k tokens, and none past either limit)."""
        if seq.num_pending_forks or seq.params.logprobs is not None:
            return 0  # samples fork off the first token's logits; logprobs are per sampled row: plain decode
        k = self.config.num_speculative_tokens
        room = self.max_model_len - len(seq) - 1
        if seq.params.max_tokens is not None:
            room = min(room, seq.params.max_tokens - seq.num_output_tokens - 1)
        return max(0, min(k, room))

    # -- before the forward pass ---------------------------------------------------------------
    def adjust(self, step: StepContext) -> None:
        """Proposals for every entry the scheduler gave lookahead slots; each then computes 1 +
        the proposals kept, and the blocks of unused slots go back."""
        reserved = [e for e in step.batch.scheduled if e.num_lookahead]
        if not reserved:
            return
        if self.draft is not None:
            step.move_blocks()  # the draft reads the step's copied and loaded blocks, and writes into copies
            self.draft.propose(self.runner, reserved)
        else:
            cfg = self.config
            for e in reserved:
                e.spec_token_ids = propose_ngram(e.seq.token_ids, e.num_lookahead, cfg.prompt_lookup_max,
                                                 cfg.prompt_lookup_min)
        for e in reserved:
            if e.seq.sampling.constraint is not None:
                self._cut_forbidden(e)
            e.num_tokens, e.num_lookahead = 1 + len(e.spec_token_ids), 0
            self.kv.truncate(e.seq, e.end)

    @staticmethod
    def _cut_forbidden(entry: ScheduledSeq) -> None:
        """Keep proposals up to the first one the constraint would not allow."""
        c = entry.seq.sampling.constraint.fork()
        for j, token in enumerate(entry.spec_token_ids):
            if not c.allows(token):
                del entry.spec_token_ids[j:]
                del entry.spec_draft_probs[j:]
                return
            c.advance(token)

    # -- after it ------------------------------------------------------------------------------
    def claims(self, entry: ScheduledSeq) -> bool:
        return bool(entry.spec_token_ids)

    def process(self, claimed: list[tuple[ScheduledSeq, int]], logits: torch.Tensor, seqs: Sequences) -> None:
        now = time.perf_counter()
        for entry, row in claimed:
            seqs.isolated(entry.seq, self._append_verified, entry, logits[row : row + 1 + len(entry.spec_token_ids)],
                          seqs, now)

    def _append_verified(self, entry: ScheduledSeq, logits: torch.Tensor, seqs: Sequences, now: float) -> None:
        """Append what verification accepted, one token at a time (each may finish the request),
        then give back the KV slots of the rejected proposals."""
        seq, tokens, appended = entry.seq, self.accept(entry, logits, seqs.eos_token_ids), []
        for token in tokens:
            seqs.advance(seq, len(seq))  # K/V of every token so far is computed and accepted
            seqs.append_token(seq, token, now)
            appended.append(token)
            if seq.is_finished:
                break
        self._record(entry, tokens, appended)
        if not seq.is_finished:
            self.kv.truncate(seq, seq.num_computed_tokens)

    @torch.inference_mode()
    def accept(self, entry: ScheduledSeq, logits: torch.Tensor, eos_token_ids: set[int] = frozenset()) -> list[int]:
        """logits [1 + k, V]: the target after the last token and after each proposal. Returns the
        tokens to append: accepted proposals, then one corrected or bonus token."""
        seq, proposal = entry.seq, entry.spec_token_ids
        if seq.sampling.constraint is not None:
            c = seq.sampling.constraint.fork()
            for j, token in enumerate([None] + proposal):
                if token is not None:
                    c.advance(token)
                logits[j] += c.mask()
        if seq.params.adjusts_logits:  # penalties and token rules, each position after its own prefix
            out = seq.output_token_ids
            rows = [Row(seq.params, seq.prompt_token_ids, out + proposal[:j]) for j in range(len(proposal) + 1)]
            logits = apply_logits_rules(logits, rows, eos_token_ids)
        if seq.params.greedy:
            tokens = accept_greedy(greedy_tokens(logits).tolist(), proposal)
        else:
            q = torch.stack(entry.spec_draft_probs) if entry.spec_draft_probs else None
            tokens = accept_sampled(target_probs(logits, seq.params), proposal, q, seq.sampling.generator)
        return tokens

    def _record(self, entry: ScheduledSeq, tokens: list[int], appended: list[int]) -> None:
        """Count one verify; `appended` stops early where a token ended the request (an accepted EOS)."""
        s, seq = self.stats, entry.seq
        s.num_drafts += 1
        s.num_draft_tokens += len(entry.spec_token_ids)
        s.num_accepted_tokens += len(tokens) - 1
        s.num_emitted_tokens += len(appended)
        if s.log is not None:
            s.log.append((seq.request_id, seq.index, len(seq) - len(appended), list(entry.spec_token_ids),
                          appended, len(tokens) - 1))
