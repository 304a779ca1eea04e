"""A Llama-family decoder (Llama, Qwen2/2.5, Qwen3, and the Mixture-of-Experts Qwen3-MoE, OLMoE, Mixtral) in plain torch.

The model sees one *packed* step: the tokens of every scheduled sequence laid end to
end in a 1-D tensor (no padding), with their positions. Everything that depends on how
K/V is stored - no cache, a contiguous cache, a paged pool - lives behind one call,
`attn_ctx.attend(layer_idx, q, k, v)`, which later chapters swap out.

With tensor parallelism (`tp`, a `nano_infer.distributed.TPShard`) each rank builds the same
modules with its share of the heads, features and vocabulary rows, and three calls stitch the
shards together: an all-reduce after o_proj and after down_proj, and the vocabulary-parallel
embedding and logits. With `tp=None` (one process) none of them runs.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .moe import SparseMoeBlock, is_sparse_layer


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (the float32 residual stream, or Qwen3's q/k heads) normalised and scaled in float32, then
        rounded once to the weight's dtype: the input of the matmuls that follow."""
        w = self.weight
        if w.dtype == torch.float32:
            return F.rms_norm(x, w.shape, w, self.eps)
        return F.rms_norm(x.float(), w.shape, w.float(), self.eps).to(w.dtype)


class WideRMSNorm(RMSNorm):
    """OLMoE's q/k norm: over all of a token's query (or key) heads at once, not head by head. Under tensor
    parallelism a rank holds some heads: it sums its squares, the all-reduce adds the other ranks' sums, and
    each rank scales its own heads by the whole width's RMS."""

    def __init__(self, dim: int, eps: float, tp=None):
        super().__init__(dim, eps)
        self.tp, self.full_dim = tp, dim * (tp.world_size if tp else 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp is None:
            return super().forward(x)
        x = x.float()
        squares = self.tp.all_reduce(x.pow(2).sum(-1, keepdim=True))
        return (x * torch.rsqrt(squares / self.full_dim + self.eps) * self.weight.float()).to(self.weight.dtype)


def rope_inv_freq(config, head_dim: int) -> tuple[torch.Tensor, float]:
    """Inverse frequencies and amplitude scaling for the config's RoPE type (default, llama3, yarn, ...)."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    rope_type = params.get("rope_type", params.get("type", "default"))
    theta = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
    if rope_type == "default":
        exponent = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
        return 1.0 / (theta**exponent), 1.0
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](config, torch.device("cpu"))
    return inv_freq.float(), float(scaling)


class Rotary(nn.Module):
    """Precomputed cos/sin for every position; a step looks its positions up once, for all layers.

    Rotating a head vector x = [x1, x2] by RoPE is x * cos + [-x2, x1] * sin. With the sign
    folded into the table (sin_signed = [-sin, sin] on the two halves) the second term is
    x.roll(half) * sin_signed: two fewer ops per layer than slicing and concatenating.
    """

    def __init__(self, config, head_dim: int, max_positions: int):
        super().__init__()
        inv_freq, scaling = rope_inv_freq(config, head_dim)
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
        self.register_buffer("cos", torch.cat([freqs.cos(), freqs.cos()], dim=-1) * scaling, persistent=False)
        self.register_buffer("sin", torch.cat([-freqs.sin(), freqs.sin()], dim=-1) * scaling, persistent=False)

    def lookup(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin_signed), each [T, 1, head_dim]: broadcast over heads."""
        return self.cos[positions].unsqueeze(1).to(dtype), self.sin[positions].unsqueeze(1).to(dtype)


def apply_rotary(x: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """x [T, heads, head_dim] rotated by its token's position."""
    cos, sin = cos_sin
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), sin)


class Attention(nn.Module):
    def __init__(self, config, layer_idx: int, tp=None):
        super().__init__()
        self.layer_idx = layer_idx
        self.tp = tp
        self.num_heads = tp.q_heads(config)[1] if tp else config.num_attention_heads
        self.num_kv_heads = tp.kv_heads(config)[1] if tp else config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        # Qwen2 always has q/k/v bias; Llama and Qwen3 say so in `attention_bias`.
        bias = getattr(config, "attention_bias", config.model_type == "qwen2")
        # q, k and v in one matmul: one kernel launch instead of three.
        self.qkv_proj = nn.Linear(config.hidden_size, (self.num_heads + 2 * self.num_kv_heads) * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=False)
        self.qk_norm = config.model_type in ("qwen3", "qwen3_moe")  # one head at a time
        if self.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.wide_qk_norm = config.model_type == "olmoe"  # all heads at once, then q, k and v clipped
        if self.wide_qk_norm:
            self.q_norm = WideRMSNorm(self.num_heads * self.head_dim, config.rms_norm_eps, tp)
            self.k_norm = WideRMSNorm(self.num_kv_heads * self.head_dim, config.rms_norm_eps, tp)
            self.clip_qkv = getattr(config, "clip_qkv", None)

    def forward(self, x, cos_sin, attn_ctx):
        T, H, KVH = x.shape[0], self.num_heads, self.num_kv_heads
        qkv = self.qkv_proj(x)
        if self.wide_qk_norm:
            q, k, v = qkv.split([H * self.head_dim, KVH * self.head_dim, KVH * self.head_dim], dim=-1)
            qkv = torch.cat([self.q_norm(q), self.k_norm(k), v], dim=-1)
            if self.clip_qkv is not None:
                qkv = qkv.clamp(-self.clip_qkv, self.clip_qkv)
        qkv = qkv.view(T, H + 2 * KVH, self.head_dim)
        qk, v = qkv.split([H + KVH, KVH], dim=1)  # q and k heads side by side: one rotary for both
        if self.qk_norm:
            qk = torch.cat([self.q_norm(qk[:, :H]), self.k_norm(qk[:, H:])], dim=1)
        q, k = apply_rotary(qk, cos_sin).split([H, KVH], dim=1)
        o = attn_ctx.attend(self.layer_idx, q, k, v)  # [T, num_heads, head_dim]
        out = self.o_proj(o.reshape(T, H * self.head_dim))
        return out if self.tp is None else self.tp.all_reduce(out)  # row-parallel: sum the ranks' partials


class MLP(nn.Module):
    def __init__(self, config, tp=None):
        super().__init__()
        bias = getattr(config, "mlp_bias", False)
        self.tp = tp
        self.inter = tp.features(config)[1] if tp else config.intermediate_size
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * self.inter, bias=bias)
        self.down_proj = nn.Linear(self.inter, config.hidden_size, bias=bias)

    def forward(self, x):
        gate, up = self.gate_up_proj(x).split(self.inter, dim=-1)
        out = self.down_proj(F.silu(gate) * up)
        return out if self.tp is None else self.tp.all_reduce(out)


class DecoderLayer(nn.Module):
    def __init__(self, config, layer_idx: int, tp=None):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer_idx, tp)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = SparseMoeBlock(config, tp) if is_sparse_layer(config, layer_idx) else MLP(config, tp)

    def forward(self, x, cos_sin, attn_ctx):
        """x: the residual stream, in float32 whatever the weights' dtype (see CausalLM)."""
        x = x + self.self_attn(self.input_layernorm(x), cos_sin, attn_ctx)  # float32 + bfloat16 is float32
        return x + self.mlp(self.post_attention_layernorm(x))


class CausalLM(nn.Module):
    """Embedding -> decoder layers -> final norm; `compute_logits` only for rows we sample.

    Weights and matmul inputs are in the engine's dtype, the residual stream between the layers is
    float32, as llama.cpp keeps its activations: it sums every layer's output, and in bfloat16 each
    sum rounds away what a small output adds. On SmolLM2's Q4_1 file in bfloat16 that took the mean
    log-prob error against transformers' float32 from 0.048 to 0.035 nats (top-1 95.2% -> 97.0%),
    for two casts a layer. In float32 nothing changes."""

    def __init__(self, config, max_positions: int | None = None, tp=None):
        super().__init__()
        self.config = config
        self.tp = tp
        vocab = tp.vocab_rows(config) if tp else config.vocab_size  # this rank's rows of the vocabulary
        self.embed_tokens = nn.Embedding(vocab, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i, tp) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        if not self.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, vocab, bias=False)
        attn = self.layers[0].self_attn
        self.num_kv_heads, self.head_dim = attn.num_kv_heads, attn.head_dim
        self.rotary = Rotary(config, self.head_dim, max_positions or config.max_position_embeddings)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn_ctx) -> torch.Tensor:
        x = self.embed_tokens(input_ids) if self.tp is None else self.tp.embed(self.embed_tokens.weight, input_ids)
        cos_sin = self.rotary.lookup(positions, x.dtype)
        x = x.float()
        for layer in self.layers:
            x = layer(x, cos_sin, attn_ctx)
        return self.norm(x)  # in the engine's dtype again, for the logits

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """Logits [N, vocab]; with tensor parallelism on rank 0 only (None on the other ranks)."""
        head = getattr(self, "lm_head", None)  # tied weights: none, unless `pack_linears` made one
        logits = F.linear(hidden, self.embed_tokens.weight) if head is None else head(hidden)
        return logits if self.tp is None else self.tp.gather_logits(logits, self.config.vocab_size)
