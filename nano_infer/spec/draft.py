"""A draft model: a smaller model with the target's tokenizer proposes k tokens, one pass each.

Its KV pool is indexed by the SAME block tables as the target's (same block ids and slots,
its own layers and heads), so allocation, forks, copy-on-write, prefix-cache sharing and
rollback of rejected tokens apply to both caches at once, with no bookkeeping of its own.
To keep its cache filled wherever the target's is, the draft runs every packed step the
target runs (`mirror`), then k single-token passes per verifying sequence (`propose`).
"""
from __future__ import annotations

import torch

from ..attention import AttentionBackend
from ..kv import KVPool
from ..models.loader import load_config, load_model, resolve_model_dir
from ..sampling import greedy_tokens
from .rejection import target_probs


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
    def __init__(self, model_name: str, target_config, target_tokenizer, device, dtype, max_model_len: int):
        self.model_dir = resolve_model_dir(model_name)
        self.config = load_config(self.model_dir)
        check_compatible(self.model_dir, self.config, target_config, target_tokenizer)
        if self.config.max_position_embeddings < max_model_len:
            raise ValueError(f"speculative_config model: the draft's max_position_embeddings="
                             f"{self.config.max_position_embeddings} is below max_model_len={max_model_len}")
        self.model = load_model(self.model_dir, self.config, device, dtype, max_model_len)
        self.kv_pool = None
        self.backend = None

    def make_pool(self, num_blocks: int, block_size: int, attention: str, device, dtype) -> None:
        """The draft's pool: as many blocks as the target's, so any block id is valid in both."""
        self.kv_pool = KVPool(self.config.num_hidden_layers, num_blocks, block_size,
                              self.model.num_kv_heads, self.model.head_dim, dtype, device)
        self.backend = AttentionBackend(attention, self.kv_pool.tensor)

    @torch.inference_mode()
    def mirror(self, ids, pos, meta) -> None:
        """Run the target's packed step through the draft: writes the draft's K/V at the same slots."""
        self.backend.meta = meta
        self.model(ids, pos, self.backend)

    @torch.inference_mode()
    def propose(self, runner, seqs_k: list[tuple]) -> None:
        """Fill `seq.spec_token_ids` with k draft tokens for each (seq, k): pass j feeds the token
        at position num_computed + j (the last known token, then each proposal in turn). A greedy
        request takes the draft's argmax; a sampled one draws from the draft's distribution
        (processed like the target's) and keeps it in `seq.spec_draft_probs` for verification."""
        for j in range(max((k for _, k in seqs_k), default=0)):
            active = [seq for seq, k in seqs_k if k > j]
            ids, pos, meta, rows = runner.prepare([(seq, 1) for seq in active], offset=j)
            self.backend.meta = meta
            logits = self.model.compute_logits(self.model(ids, pos, self.backend)[rows]).float()
            greedy = greedy_tokens(logits).tolist()
            for i, seq in enumerate(active):
                if seq.params.greedy:
                    seq.spec_token_ids.append(greedy[i])
                    continue
                q = target_probs(logits[i : i + 1], seq.params)[0]
                seq.spec_token_ids.append(int(torch.multinomial(q, 1, generator=seq.generator)))
                seq.spec_draft_probs.append(q)
