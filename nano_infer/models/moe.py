"""Mixture of Experts (chapter 15): a router sends each token to a few of many expert MLPs (Qwen3-MoE, OLMoE, Mixtral).

A sparse layer replaces the dense MLP: a linear `gate` scores every expert for a token, a softmax
over the scores (in float32) and a top-k pick `num_experts_per_tok` of them, and the token's output
is the sum of those experts' outputs, each weighted by its probability (renormalised to sum to 1 when
the config says `norm_topk_prob`: Qwen3-MoE does, OLMoE does not, Mixtral always does).

The experts run as grouped matmuls: the step's token-expert pairs are sorted by expert, so each
expert's tokens lie side by side and one matmul per expert (gate and up fused, then down) covers
them all; the weighted outputs are scatter-added back to their tokens. A step touches only the
experts its tokens chose: at batch 1 that is `k` of them, at a large batch nearly all. Looping over
experts costs one host round trip a layer to learn each expert's share of the step (`bincount`), which
rules out CUDA graphs for a model with experts (the engine runs it eagerly).

Under tensor parallelism every rank holds every token (attention leaves the residual stream whole
on each), so an expert needs no tokens sent to it. Two ways to cut the experts, vLLM's two:
- `enable_expert_parallel=False`: each rank holds a slice of every expert's intermediate features,
  as the dense MLP is cut;
- `enable_expert_parallel=True`: each rank holds `num_experts / world_size` whole experts and runs
  only the pairs routed to them.
Either way each rank's output is a partial sum over the pairs (or features) it holds, and the
all-reduce the dense MLP already makes adds them.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..config import expert_intermediate_size, num_experts


def is_moe(config) -> bool:
    return num_experts(config) > 0 and config.model_type in ("qwen3_moe", "olmoe", "mixtral")


def is_sparse_layer(config, layer_idx: int) -> bool:
    """Whether layer `layer_idx` has experts: every layer of OLMoE; Qwen3-MoE's config may keep some dense
    (`mlp_only_layers`) or make only every `decoder_sparse_step`-th sparse."""
    if not is_moe(config) or layer_idx in (getattr(config, "mlp_only_layers", None) or []):
        return False
    return (layer_idx + 1) % getattr(config, "decoder_sparse_step", 1) == 0


def route(router_logits: torch.Tensor, top_k: int, norm_topk_prob: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, k] float32, experts [T, k]): the softmax's k largest probabilities and their experts,
    renormalised to sum to 1 if `norm_topk_prob`."""
    probs = F.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, experts = torch.topk(probs, top_k, dim=-1)
    if norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, experts


def group_by_expert(experts: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(order, counts): the flattened token-expert pairs [T * k] sorted by expert (stable, so a token's pairs
    keep their top-k order within an expert), and how many pairs each expert got."""
    flat = experts.flatten()
    return flat.argsort(stable=True), torch.bincount(flat, minlength=num_experts)


class Experts(nn.Module):
    """This rank's experts as two stacked weights: `gate_up_proj` [E, 2 * inter, hidden] and `down_proj`
    [E, hidden, inter], experts `first_expert` .. `first_expert + E` of the model's. In bfloat16 on a CPU
    the loader swaps it for models/packed.py's PackedExperts: the same forward, each expert's `mlp` on
    weights laid out for oneDNN."""

    def __init__(self, num_experts: int, first_expert: int, hidden: int, inter: int):
        super().__init__()
        self.num_experts, self.first_expert, self.inter = num_experts, first_expert, inter
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * inter, hidden), requires_grad=False)
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, inter), requires_grad=False)

    def forward(self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        """x [T, hidden]; weights, experts [T, k] (the model's expert numbers) -> [T, hidden] in float32: the
        weighted sum of the outputs of the pairs this rank holds."""
        k = experts.shape[1]
        local = experts - self.first_expert
        held = (local >= 0) & (local < self.num_experts)
        # pairs of experts another rank holds sort last, under a number past this rank's experts
        order, counts = group_by_expert(local.masked_fill(~held, self.num_experts), self.num_experts + 1)
        token = order // k
        rows = x[token]
        out = torch.empty(len(order), x.shape[1], dtype=torch.float32, device=x.device)
        start = 0
        for e, n in enumerate(counts[:-1].tolist()):  # the host sync: each expert's share of the step
            if n:
                out[start:start + n] = self.mlp(e, rows[start:start + n])
            start += n
        mine = slice(0, start)
        out = out[mine] * weights.flatten()[order[mine]].unsqueeze(-1)
        return torch.zeros(x.shape, dtype=torch.float32, device=x.device).index_add_(0, token[mine], out)

    def mlp(self, e: int, rows: torch.Tensor) -> torch.Tensor:
        """Local expert `e`'s gated MLP on the rows routed to it: [n, hidden] -> [n, hidden]."""
        gate, up = F.linear(rows, self.gate_up_proj[e]).split(self.inter, dim=-1)
        return F.linear(F.silu(gate) * up, self.down_proj[e])


class SparseMoeBlock(nn.Module):
    """Router + experts in the place of the dense MLP; output in float32 (the residual stream's dtype)."""

    def __init__(self, config, tp=None):
        super().__init__()
        self.tp = tp
        self.top_k = config.num_experts_per_tok
        self.norm_topk_prob = bool(getattr(config, "norm_topk_prob", True))  # Mixtral's config has no such field
        self.gate = nn.Linear(config.hidden_size, num_experts(config), bias=False)
        first, count = tp.experts(config) if tp else (0, num_experts(config))
        inter = tp.expert_features(config)[1] if tp else expert_intermediate_size(config)
        self.experts = Experts(count, first, config.hidden_size, inter)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, experts = route(self.gate(x), self.top_k, self.norm_topk_prob)
        out = self.experts(x, weights, experts)
        return out if self.tp is None else self.tp.all_reduce(out)
