"""The engine's side of speculative decoding: how many tokens to reserve, propose, verify, roll back.

One step for a decoding sequence:
1. the scheduler reserves 1 + k tokens (its last token and k proposals) in the token budget
   and the KV pool (`lookahead`);
2. `propose` fills `seq.spec_token_ids`, cuts what a constraint forbids and gives back the
   slots it did not use;
3. the runner computes all 1 + k positions in one pass and returns a logit row for each;
4. `accept` keeps the longest accepted prefix plus one corrected or bonus token; the engine
   appends them and calls `rollback`, which frees the blocks that only rejected tokens used.
Nothing of a rejected token reaches the prefix cache: caching reads `num_computed_tokens`,
which only ever counts accepted tokens once the step is over.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..sampling import greedy_tokens
from .config import SpeculativeConfig
from .ngram import propose_ngram
from .rejection import accept_greedy, accept_sampled, target_probs


@dataclass
class SpecStats:
    num_drafts: int = 0  # verify passes (one per sequence per step that had proposals)
    num_draft_tokens: int = 0  # tokens proposed and verified
    num_accepted_tokens: int = 0  # of those, accepted
    num_emitted_tokens: int = 0  # tokens appended by verify passes (accepted + corrected/bonus)
    log: list | None = None  # set to [] to record each verify: (request_id, index, length, proposal, tokens)

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_tokens_per_verify(self) -> float:
        return self.num_emitted_tokens / self.num_drafts if self.num_drafts else 0.0


class SpeculativeDecoder:
    def __init__(self, config: SpeculativeConfig, kv, draft=None, max_model_len: int = 0):
        self.config = config
        self.kv = kv
        self.draft = draft  # DraftProposer, or None for n-gram lookup
        self.max_model_len = max_model_len
        self.stats = SpecStats()

    def lookahead(self, seq) -> int:
        """Proposal slots the scheduler may reserve: k, less near max_tokens or max_model_len
        (a verify appends up to 1 + k tokens, and none past either limit)."""
        if seq.num_pending_forks or seq.params.logprobs is not None:
            return 0  # samples fork off the first token's logits; logprobs are per sampled row: plain decode
        k = self.config.num_speculative_tokens
        room = self.max_model_len - len(seq) - 1
        if seq.params.max_tokens is not None:
            room = min(room, seq.params.max_tokens - seq.num_output_tokens - 1)
        return max(0, min(k, room))

    def propose(self, runner, scheduled: list[tuple]) -> list[tuple]:
        """Proposals for every sequence the scheduler gave lookahead slots; returns `scheduled`
        with each count shrunk to 1 + the proposals kept, and the unused blocks given back."""
        for seq, _ in scheduled:  # a step that failed half-way may have left proposals behind
            self.clear(seq)
        reserved = [(seq, n - 1) for seq, n in scheduled if n > 1 and seq.num_uncomputed_tokens == 1]
        if not reserved:
            return scheduled
        cfg = self.config
        if self.draft is not None:
            self.draft.propose(runner, reserved)
        else:
            for seq, k in reserved:
                seq.spec_token_ids = propose_ngram(seq.token_ids, k, cfg.prompt_lookup_max, cfg.prompt_lookup_min)
        for seq, _ in reserved:
            if seq.constraint is not None:
                self._cut_forbidden(seq)
        out = []
        for seq, n in scheduled:
            if n > 1 and seq.num_uncomputed_tokens == 1:
                n = 1 + len(seq.spec_token_ids)
                self.rollback(seq, seq.num_computed_tokens + n)
            out.append((seq, n))
        return out

    @staticmethod
    def _cut_forbidden(seq) -> None:
        """Keep proposals up to the first one the constraint would not allow."""
        c = seq.constraint.fork()
        for j, token in enumerate(seq.spec_token_ids):
            if c.index.next_state(c.state, token) < 0:
                del seq.spec_token_ids[j:]
                del seq.spec_draft_probs[j:]
                return
            c.advance(token)

    @torch.inference_mode()
    def accept(self, seq, logits: torch.Tensor) -> list[int]:
        """logits [1 + k, V]: the target after the last token and after each proposal. Returns the
        tokens to append: accepted proposals, then one corrected or bonus token."""
        proposal = seq.spec_token_ids
        if seq.constraint is not None:
            c = seq.constraint.fork()
            for j, token in enumerate([None] + proposal):
                if token is not None:
                    c.advance(token)
                logits[j] += c.mask()
        if seq.params.greedy:
            tokens = accept_greedy(greedy_tokens(logits).tolist(), proposal)
        else:
            q = torch.stack(seq.spec_draft_probs) if seq.spec_draft_probs else None
            tokens = accept_sampled(target_probs(logits, seq.params), proposal, q, seq.generator)
        s = self.stats
        s.num_drafts += 1
        s.num_draft_tokens += len(proposal)
        s.num_accepted_tokens += len(tokens) - 1
        s.num_emitted_tokens += len(tokens)
        if s.log is not None:
            s.log.append((seq.request_id, seq.index, len(seq), list(proposal), list(tokens)))
        return tokens

    def rollback(self, seq, num_tokens: int) -> None:
        """Keep K/V slots for the first `num_tokens` positions only: blocks past them go back."""
        self.kv.truncate(seq, num_tokens)

    @staticmethod
    def clear(seq) -> None:
        seq.spec_token_ids = []
        seq.spec_draft_probs = []
