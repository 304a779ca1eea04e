"""bfloat16 linear layers on a CPU, with their weights laid out once for oneDNN's matmul kernel.

A plain `F.linear` hands oneDNN a row-major weight, which it reorders into its own blocked
layout inside every call. Reordering once at load time (`_reorder_linear_weight`) and calling
the kernel on the blocked weight gives the same numbers, faster: the per-call reorder weighs
most on a decode step's few to a hundred rows and vanishes beside a prefill chunk's matmul (the
README's list of what makes the CPU path fast gives the gain on a whole workload). In float32 the
same trick gained nothing consistent, so float32 keeps `nn.Linear`.

The blocked weight is an opaque tensor: it has the weight's shape, but no storage to slice or
save. Nothing reads a linear weight after loading except tensor-parallel lessons, which run
in float32.

A Mixture-of-Experts layer's experts (models/moe.py) are many small linears, and a step runs each on
a few rows: the per-call reorder weighs on them as on a decode step's dense linears, so every expert's
two weights are packed too (`PackedExperts`). The stacked weights they were loaded as are dropped, not
kept beside the packed ones: experts are most of an MoE model's bytes.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .moe import Experts


def can_pack(device: torch.device, dtype: torch.dtype) -> bool:
    """A CPU in bfloat16 whose oneDNN takes bfloat16 (it refuses on CPUs without AVX512 or AMX)."""
    return (device.type == "cpu" and dtype == torch.bfloat16 and torch.backends.mkldnn.is_available()
            and torch.ops.mkldnn._is_mkldnn_bf16_supported())


class PackedLinear(nn.Module):
    """`x @ weight.T + bias` through oneDNN on a weight reordered for it."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, copy: bool = False, batch_hint: int = 32):
        super().__init__()
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), batch_hint)
        if copy:  # a second layout of a weight the model already counts among its parameters
            self.register_buffer("weight", packed, persistent=False)
        else:
            self.weight = nn.Parameter(packed, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():  # inductor lowers this kernel only for a frozen weight: called as it is
            return packed_linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")


# oneDNN's matmul on a packed weight as an op of its own, opaque to torch.compile (engine/compiled_decode.py)
_LIB = torch.library.Library("nano_infer", "FRAGMENT")
_LIB.define("packed_linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor")
_LIB.impl("packed_linear", lambda x, weight, bias: torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], ""),
          "CompositeExplicitAutograd")  # (a packed weight is a oneDNN tensor: dispatched under its own key)
torch.library.register_fake("nano_infer::packed_linear",
                            lambda x, weight, bias: x.new_empty(*x.shape[:-1], weight.shape[0]), lib=_LIB)
packed_linear = torch.ops.nano_infer.packed_linear


class PackedExperts(Experts):
    """`Experts` with each expert's gate-up and down weights a PackedLinear: the same grouping, the same
    loop over experts (`Experts.forward`), a packed matmul per expert."""

    def __init__(self, experts: Experts):
        nn.Module.__init__(self)  # not Experts.__init__: the stacked weights give way to a packed pair per expert
        self.num_experts, self.first_expert, self.inter = experts.num_experts, experts.first_expert, experts.inter
        self.gate_up = nn.ModuleList(PackedLinear(w, None) for w in experts.gate_up_proj)
        self.down = nn.ModuleList(PackedLinear(w, None) for w in experts.down_proj)

    def mlp(self, e: int, rows: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up[e](rows).split(self.inter, dim=-1)
        return self.down[e](F.silu(gate) * up)

    @property
    def gate_up_proj(self) -> torch.Tensor:
        """The stacked weight [E, 2 * inter, hidden] read back out of the packed ones: a copy, for reading."""
        return torch.stack([p.weight.to_dense() for p in self.gate_up])

    @property
    def down_proj(self) -> torch.Tensor:
        """The stacked weight [E, hidden, inter] read back out of the packed ones: a copy, for reading."""
        return torch.stack([p.weight.to_dense() for p in self.down])


def pack_linears(model: nn.Module) -> None:
    """Swap every nn.Linear of the model for a PackedLinear and every layer's Experts for PackedExperts, and
    give a model whose logits reuse the embedding matrix (tied weights) a packed copy of it for the logits:
    the lookup needs the plain one. (A model whose embedding is held quantized already has its own `lm_head`.)"""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear):
                setattr(parent, name, PackedLinear(child.weight, child.bias))
            elif isinstance(child, Experts) and not isinstance(child, PackedExperts):
                setattr(parent, name, PackedExperts(child))
    if getattr(model, "tie_word_embeddings", False) and not hasattr(model, "lm_head"):
        model.lm_head = PackedLinear(model.embed_tokens.weight, None, copy=True)
