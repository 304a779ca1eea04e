"""Which slice of every weight one tensor-parallel rank holds, and the collectives that stitch the slices.

A decoder layer is cut so that each rank talks to the others only twice:

- column-parallel: q/k/v and gate/up. Each rank holds some output rows: its own query heads
  (with the KV heads they read), its own slice of the MLP's intermediate features. No
  communication: attention and the SiLU gate work head by head and feature by feature.
- row-parallel: o_proj and down_proj. Each rank holds the input columns that match its heads
  or features, so its matmul gives a partial sum of the full output; one all-reduce adds them.
- vocabulary-parallel: embedding and LM head. Each rank holds a slice of the vocabulary rows
  (ceil(vocab / ranks) of them, the last slice padded with zero rows when the vocabulary does
  not divide). A token's embedding comes from the one rank that holds its row (the others give
  zeros, an all-reduce adds them); each rank scores its own slice of the vocabulary and the
  driver gathers the slices into full logits, dropping the padding.

KV heads are split when `num_key_value_heads` divides by the number of ranks. Otherwise (more
ranks than KV heads, e.g. 4 ranks and 2 KV heads) each rank keeps the one KV head its query
heads read, so a KV head is replicated on `world_size // num_key_value_heads` ranks.

A Mixture-of-Experts layer (models/moe.py) is cut like the MLP, every expert's features split
across the ranks, or with `expert_parallel` by whole experts: each rank holds `num_experts /
world_size` of them and reads none of the others' tensors. The router is whole on every rank.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..config import expert_intermediate_size, num_experts
from ..core.utils import cdiv


@dataclass
class TPShard:
    """Rank `rank` of `world_size`: the slices it holds, and the collectives it joins in `group` (the
    step group, set once the ranks have met; the weights are cut before that)."""

    rank: int
    world_size: int
    group: dist.ProcessGroup | None = None
    expert_parallel: bool = False  # whole experts per rank (vLLM's enable_expert_parallel), not slices of each

    # -- what this rank holds ----------------------------------------------------------------------
    def q_heads(self, config) -> tuple[int, int]:
        """(first query head, number of query heads) on this rank."""
        n = config.num_attention_heads // self.world_size
        return self.rank * n, n

    def kv_heads(self, config) -> tuple[int, int]:
        """(first KV head, number of KV heads) on this rank: a split, or the one head its query heads read."""
        kv = config.num_key_value_heads
        if kv % self.world_size == 0:
            n = kv // self.world_size
            return self.rank * n, n
        return self.rank // (self.world_size // kv), 1

    def features(self, config) -> tuple[int, int]:
        """(first, count) of the MLP's intermediate features on this rank."""
        n = config.intermediate_size // self.world_size
        return self.rank * n, n

    def experts(self, config) -> tuple[int, int]:
        """(first expert, number of experts) on this rank: a share of them with expert parallelism, else all."""
        experts = num_experts(config)
        if not self.expert_parallel:
            return 0, experts
        n = experts // self.world_size
        return self.rank * n, n

    def expert_features(self, config) -> tuple[int, int]:
        """(first, count) of each expert's intermediate features on this rank: all of them with expert parallelism."""
        inter = expert_intermediate_size(config)
        if self.expert_parallel:
            return 0, inter
        n = inter // self.world_size
        return self.rank * n, n

    def holds(self, name: str, config) -> bool:
        """Whether this rank reads the checkpoint tensor `name` at all: with expert parallelism, not another
        rank's experts."""
        if ".experts." not in name:
            return True
        first, n = self.experts(config)
        return first <= int(name.split(".experts.")[1].split(".")[0]) < first + n

    def vocab_rows(self, config) -> int:
        """Rows of the embedding and LM head on every rank: ceil(vocab / world_size), padding included."""
        return cdiv(config.vocab_size, self.world_size)

    def vocab(self, config) -> tuple[int, int]:
        """(first, stop) of the real vocabulary rows this rank holds (fewer than vocab_rows on the last rank
        when the vocabulary does not divide)."""
        n = self.vocab_rows(config)
        return min(self.rank * n, config.vocab_size), min((self.rank + 1) * n, config.vocab_size)

    def partition(self, name: str, config, head_dim: int) -> tuple[int, int, int] | None:
        """(dim, start, stop) of the checkpoint tensor `name` (HF name without "model.") on this rank;
        None when every rank holds all of it (norms)."""
        if ".experts." in name:
            first, n = self.expert_features(config)
            if self.expert_parallel:
                return None
            return (1 if ".down_proj." in name else 0), first, first + n
        if config.model_type == "olmoe" and (".q_norm." in name or ".k_norm." in name):  # one weight over all heads
            first, n = (self.q_heads if ".q_norm." in name else self.kv_heads)(config)
            return 0, first * head_dim, (first + n) * head_dim
        if ".q_proj." in name:
            first, n = self.q_heads(config)
            return 0, first * head_dim, (first + n) * head_dim
        if ".k_proj." in name or ".v_proj." in name:
            first, n = self.kv_heads(config)
            return 0, first * head_dim, (first + n) * head_dim
        if ".o_proj." in name:
            first, n = self.q_heads(config)
            return 1, first * head_dim, (first + n) * head_dim
        if ".gate_proj." in name or ".up_proj." in name:
            first, n = self.features(config)
            return 0, first, first + n
        if name.endswith("down_proj.weight"):
            first, n = self.features(config)
            return 1, first, first + n
        if name in ("embed_tokens.weight", "lm_head.weight"):
            return 0, *self.vocab(config)  # the loader pads to vocab_rows
        return None  # norms, and down_proj's bias (added once, by rank 0: see the loader)

    # -- the collectives ---------------------------------------------------------------------------
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum the ranks' partial outputs of a row-parallel layer, in place."""
        dist.all_reduce(x, group=self.group)
        return x

    def embed(self, weight: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        """Vocabulary-parallel lookup: rows this rank does not hold give zeros, the all-reduce fills them in."""
        local = input_ids - self.rank * weight.shape[0]
        outside = (local < 0) | (local >= weight.shape[0])
        x = F.embedding(local.masked_fill(outside, 0), weight)
        return self.all_reduce(x.masked_fill_(outside.unsqueeze(-1), 0))

    def gather_logits(self, logits: torch.Tensor, vocab_size: int) -> torch.Tensor | None:
        """[N, vocab_rows] on every rank -> [N, vocab_size] on rank 0 (the driver samples); None elsewhere."""
        logits = logits.contiguous()
        parts = [torch.empty_like(logits) for _ in range(self.world_size)] if self.rank == 0 else None
        dist.gather(logits, parts, dst=0, group=self.group)
        return torch.cat(parts, dim=-1)[:, :vocab_size] if self.rank == 0 else None
