"""A draft model: a smaller model with the target's tokenizer proposes k tokens, one pass each.

Its KV pool is indexed by the SAME block tables as the target's (same block ids and slots,
its own layers and heads), so allocation, forks, copy-on-write, prefix-cache sharing and
rollback of rejected tokens apply to both caches at once, with no bookkeeping of its own.
To keep its cache filled wherever the target's is, the runner runs the draft on every packed
step the target runs (`ModelRunner.mirror`), then the draft makes k single-token passes per
verifying sequence (`propose`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..core.batch import ScheduledSeq
from ..engine.model_runner import ModelRunner
from ..engine.sampling import greedy_tokens
from ..kv import KVPool
from ..models.loader import load_config, load_model, resolve_model_dir
from .rejection import target_probs

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedTokenizerBase


def check_compatible(draft_dir, draft_config, target_config, target_tokenizer) -> None:
    """A draft must speak the target's token ids: same vocabulary size and the same tokenizer."""
    from transformers import AutoTokenizer

    if draft_config.vocab_size != target_config.vocab_size:
        raise ValueError(f"speculative_config model: the draft's vocab_size={draft_config.vocab_size} differs from "
                         f"the target's {target_config.vocab_size}; a draft must share the target's tokenizer")
    if AutoTokenizer.from_pretrained(draft_dir).get_vocab() != target_tokenizer.get_vocab():
        raise ValueError(f"speculative_config model: the draft's tokenizer ({draft_dir}) maps tokens to other ids "
                         f"than the target's; a draft must share the target's tokenizer")


class DraftProposer:
    def __init__(self, model_name: str, target_config: PretrainedConfig, target_tokenizer: PreTrainedTokenizerBase,
                 device: torch.device, dtype: torch.dtype, max_model_len: int, kv_cache_dtype: str = "auto"):
        self.model_dir = resolve_model_dir(model_name)
        self.config = load_config(self.model_dir)
        check_compatible(self.model_dir, self.config, target_config, target_tokenizer)
        if self.config.max_position_embeddings < max_model_len:
            raise ValueError(f"speculative_config model: the draft's max_position_embeddings="
                             f"{self.config.max_position_embeddings} is below max_model_len={max_model_len}")
        self.model = load_model(self.model_dir, self.config, device, dtype, max_model_len)
        self.device, self.dtype = device, dtype
        self.kv_cache_dtype = kv_cache_dtype  # the target's: the draft's pool is stored the same way
        self.kv_pool = None
        self.backend = None

    def attach(self, runner: ModelRunner, num_blocks: int, block_size: int, attention: str) -> None:
        """The draft's pool (as many blocks as the target's, so any block id is valid in both),
        kept filled by the runner on every step."""
        target = runner.kv_pool  # the same exact open-block rows as the target's, if its pool is 8-bit
        self.kv_pool = KVPool(self.config.num_hidden_layers, num_blocks, block_size, self.model.num_kv_heads,
                              self.model.head_dim, self.dtype, self.device, self.kv_cache_dtype, target.open_rows,
                              target.open_ring)
        self.backend = runner.mirror(self.model, self.kv_pool, attention)

    @torch.inference_mode()
    def propose(self, runner: ModelRunner, entries: list[ScheduledSeq]) -> None:
        """Fill each entry's `spec_token_ids` with `num_lookahead` draft tokens: pass j feeds the
        token at position start + j (the last known token, then each proposal in turn). A greedy
        request takes the draft's argmax; a sampled one draws from the draft's distribution
        (processed like the target's) and keeps it in `spec_draft_probs` for verification."""
        for j in range(max((e.num_lookahead for e in entries), default=0)):
            active = [e for e in entries if e.num_lookahead > j]
            passes = [ScheduledSeq(e.seq, e.start + j, 1, spec_token_ids=e.spec_token_ids) for e in active]
            ids, pos, meta, rows = runner.prepare(passes)
            self.backend.meta = meta
            logits = self.model.compute_logits(self.model(ids, pos, self.backend)[rows]).float()
            greedy = greedy_tokens(logits).tolist()
            for i, e in enumerate(active):
                if e.seq.params.greedy:
                    e.spec_token_ids.append(greedy[i])
                    continue
                q = target_probs(logits[i : i + 1], e.seq.params)[0]
                e.spec_token_ids.append(int(torch.multinomial(q, 1, generator=e.seq.sampling.generator)))
                e.spec_draft_probs.append(q)
