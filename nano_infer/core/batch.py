"""One engine step's records: what the scheduler decided each sequence computes, and the block copies that
run before the forward pass. Decided once by the scheduler, read by the plug-ins, the model runner (and, under
tensor parallelism, every worker) and the output processor after it."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .sequence import Sequence
from .utils import cdiv


@dataclass
class BlockSwap:
    """One step's block copies, as plain lists (a tensor-parallel driver sends it to its workers), run in
    this order (`ModelRunner.apply_swap`): device -> host (offloads, swap-outs: the blocks may be reused
    this step), copy-on-write (its source may be an idle cached block that a load reuses this step),
    host -> device (loads, swap-ins). A draft model's pool gets the same copies at the same time."""

    out: list[tuple[int, int]]  # (device block, host block)
    copies: list[tuple[int, int]]  # copy-on-write (src, dst) device blocks
    into: list[tuple[int, int]]  # (host block, device block)
    open_block_copies: list[tuple[int, int]] = field(default_factory=list)  # (src, dst) rows of forks (8-bit K/V)

    def __bool__(self) -> bool:
        return bool(self.out or self.copies or self.into or self.open_block_copies)


@dataclass(eq=False)
class ScheduledSeq:
    """One sequence's work in a step: positions [start, start + num_tokens) get their K/V computed.

    A decode computes its one new token; a prefill chunk computes part of the prompt; a verify
    (speculative decoding) computes the last token plus `spec_token_ids`, the proposals, which a
    plug-in fills into the `num_lookahead` slots the scheduler reserved. An entry samples only
    when it reaches the end of what is known: one row, or one per proposal plus one. A request
    that asks for prompt logprobs also gets the rows of the prompt positions it computes.
    """

    seq: Sequence
    start: int
    num_tokens: int
    num_lookahead: int = 0  # KV slots reserved past the step for proposals
    spec_token_ids: list[int] = field(default_factory=list)
    # the draft model's distribution for each proposal when the request samples (none: a point mass)
    spec_draft_probs: list[torch.Tensor] = field(default_factory=list)

    @property
    def end(self) -> int:
        return self.start + self.num_tokens

    @property
    def token_ids(self) -> list[int]:
        """The tokens fed this step: known tokens, then proposals."""
        known = self.seq.token_ids + self.spec_token_ids if self.spec_token_ids else self.seq.token_ids
        return known[self.start : self.end]

    @property
    def num_sample_rows(self) -> int:
        """0 for a prefill chunk short of the prompt's end, else 1 + the proposals it verifies."""
        if self.end < len(self.seq) + len(self.spec_token_ids):
            return 0
        return min(self.num_tokens, 1 + len(self.spec_token_ids))

    @property
    def num_prompt_logit_rows(self) -> int:
        """Rows that score prompt tokens (SamplingParams.prompt_logprobs): position p's row is the
        distribution of token p + 1, for the prompt tokens this step reaches that are not scored yet."""
        scored = self.seq.sampling.prompt_logprobs
        if scored is None:
            return 0
        return max(0, min(self.end, self.seq.num_prompt_tokens - 1) - max(self.start, len(scored) - 1))

    @property
    def num_logit_rows(self) -> int:
        """Prompt rows, then sample rows: together the entry's last rows (the prompt rows run up to
        the position that samples)."""
        return self.num_prompt_logit_rows + self.num_sample_rows

    @property
    def is_decode(self) -> bool:
        """One query token, or the last token and its proposals (a verify): batched as decodes."""
        return self.num_tokens == 1 or self.num_tokens == 1 + len(self.spec_token_ids)

    @property
    def kind(self) -> str:
        """ "decode" for the K/V of a generated token (and the proposals after it), else "prefill"."""
        return "decode" if self.is_decode and self.start >= self.seq.num_prompt_tokens else "prefill"

    def num_blocks(self, block_size: int) -> int:
        """Blocks of the block table this step's attention reads."""
        return cdiv(self.end, block_size)


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    copies: list[tuple[int, int]] = field(default_factory=list)  # copy-on-write (src, dst) blocks, before the step
    open_block_copies: list[tuple[int, int]] = field(default_factory=list)  # forks' open-block rows (8-bit K/V)

    @property
    def num_batched_tokens(self) -> int:
        return sum(e.num_tokens + e.num_lookahead for e in self.scheduled)


@dataclass
class StepInput:
    """One packed step as plain lists: small to pickle, the same on every tensor-parallel rank."""

    input_ids: list[int]
    positions: list[int]
    slot_mapping: list[int] | None  # None without a KV cache
    prefills: list[tuple[int, int, int, list[int] | None]]  # (q_start, q_len, context_len, block_table)
    # (first row, block tables padded, context lens, query tokens per sequence: 1, or 1 + proposals for a verify)
    decodes: list[tuple[int, list[list[int]], list[int], int]]
    sample_rows: list[int]  # rows whose logits are returned, in scheduled order (ScheduledSeq.num_logit_rows each)
    moves: BlockSwap | None = None  # the step's block copies no plug-in ran earlier, before the forward pass
    open_blocks: StepOpenBlocks | None = None  # 8-bit K/V: where each query's own block is kept exact


@dataclass
class StepOpenBlocks:
    """A step's open-block slots (kv/open_blocks.py), as plain lists: which rows of the step are written to
    which slots (the tokens a later step reads exactly), for each prefill chunk the slots of the tokens
    before it in its first block, and for each decode batch each sequence's slots of the blocks its
    queries sit in (the first query's block, and for a verify the next)."""

    write_rows: list[int]
    write_slots: list[int]
    prefill_slots: list[list[int]]
    decode_slots: list[list[list[int]]]
