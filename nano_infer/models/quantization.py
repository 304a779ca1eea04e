"""Weights held as 4- or 8-bit integers, and the layers that multiply by them as stored.

Decode at one sequence reads every weight once per token, so its time follows the bytes: a
4-bit weight with one scale and zero per 32 is ~4.5 bits against bfloat16's 16. llama.cpp's
Q4_0 / Q4_1 / Q4_K blocks are such groups (w = d * q + m, q in 0..15, 32 weights per (d, m):
`quant_formats.py` unpacks them), so they map exactly onto torch's group-wise int4 kernel, which
computes (q - 8) * scale + zero: scale = d, zero = m + 8d.

torch's CPU int4 and int8 kernels are vectorized for bfloat16 activations only (float32 runs a
scalar loop, far slower than a float32 matmul), and they re-read the weights for every 4 rows:
a win for one row, even at 4, slower than a dense matmul from 8 rows up. So an engine that
runs more than `INT4_MAX_ROWS` sequences in a step gives each int4 layer a dense copy of its
weight for the steps of many rows (`DenseCopies`): one chat reads 4-bit weights, a batch runs
the dense matmul, and only a batch pays the dense copy's memory. Before that, a prompt chunk of
more than `DEQUANTIZE_ROWS` tokens dequantizes each layer for its own matmul and lets it go.
"""
from __future__ import annotations

import functools
from collections import Counter

import torch
import torch.nn.functional as F
from torch import nn

from .packed import PackedLinear, can_pack
from .quant_formats import GROUP, Int4Weight, Int8Weight, RowInt8Weight
# The most rows the int4 kernel multiplies before a dense copy (when there is one) takes over: reading a third of the
# bytes wins while few rows share each read, but the kernel re-reads them every 4 rows (chapter 13 times both forms).
INT4_MAX_ROWS = 4
# Past this many rows with no dense copy (a long prompt chunk), each layer is dequantized for its own matmul: a cost
# per layer that a dense bfloat16 matmul on AMX wins back well below this bound. Without AMX a bfloat16 matmul is
# slower, so the bound keeps a margin (chapter 13 times a prompt through the int4 kernel and dequantized).
DEQUANTIZE_ROWS = 192


class Int4Linear(nn.Module):
    """`x @ w.T + bias` through torch's group-wise int4 kernel, w never expanded to floats.

    The kernel takes the scale and zero in the activations' dtype: exact in float32; in bfloat16
    each d and m + 8d is rounded to 8 significant bits (a float16 d has 11).
    """

    def __init__(self, w: Int4Weight, bias: torch.Tensor | None, dtype: torch.dtype):
        super().__init__()
        n, k = w.q.shape
        if k % GROUP or n % 16:
            raise ValueError(f"an int4 weight of shape {(n, k)} needs in_features % {GROUP} == 0 and out_features % 16 == 0")
        # the kernel's layout takes int32 values (4 bytes a weight): packed 1,024 rows at a time (a multiple of
        # its 64-row blocks, so the result is the same) to keep that transient small (a 49,152-row head: 226 MB)
        packed = torch.cat([torch.ops.aten._convert_weight_to_int4pack_for_cpu(w.q[i:i + 1024].to(torch.int32), 1)
                            for i in range(0, n, 1024)])
        scales_and_zeros = torch.stack([w.d, w.m + 8 * w.d], dim=-1).transpose(0, 1).contiguous().to(dtype)
        self.register_buffer("packed", packed, persistent=False)  # [N, K / 2] in the kernel's own order
        self.register_buffer("scales_and_zeros", scales_and_zeros, persistent=False)  # [K / 32, N, 2]
        self.register_buffer("bias", None if bias is None else bias.to(dtype), persistent=False)
        self.in_features, self.out_features = k, n
        self.dense = None  # the weight dequantized, for steps of more than INT4_MAX_ROWS rows (`hold_dense_copy`)
        # past this many rows without it, the layer dequantizes for the one matmul; in float32, where the kernel is
        # a scalar loop, past INT4_MAX_ROWS
        self.dequantize_rows = DEQUANTIZE_ROWS if dtype == torch.bfloat16 else INT4_MAX_ROWS

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])  # the packed step is 2-D: no view to make
        if self.dense is not None and rows.shape[0] > INT4_MAX_ROWS:
            out = self.dense(rows)
        elif rows.shape[0] > self.dequantize_rows:  # a long prompt chunk: no memory held past this matmul
            out = F.linear(rows, self.dequantized())
        else:
            out = self.int4_mm(rows)
        if rows is not x:
            out = out.view(*x.shape[:-1], self.out_features)
        bias = self.bias
        return out if bias is None else out + bias

    def int4_mm(self, rows: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int4pack_mm_for_cpu(rows, self.packed, GROUP, self.scales_and_zeros)

    def dequantized(self) -> torch.Tensor:
        """The kernel's own values, rounded once to the activations' dtype."""
        return int4_dequantize(self, self.scales_and_zeros.dtype)

    def hold_dense_copy(self) -> int:
        """Keep the weight dequantized beside the int4 one, for steps of many rows; returns the bytes it takes."""
        weight = self.dequantized()
        self.dense = PackedLinear(weight, None, copy=True) if can_pack(weight.device, weight.dtype) else _Dense(weight)
        return weight.nbytes


class Q8Linear(Int4Linear):
    """A Q8_0 weight (w = d * q, q an int8) through the same int4 kernel: q + 128 = 16 * hi + lo splits
    each byte into two 4-bit halves, w = 16d * (hi - 8) + d * lo, so one int4 matmul of [x, x] against
    [hi | lo] (scales 16d and d, zeros 0 and 8d) sums both, with no rounding of q (d is rounded to the
    activations' dtype, as every int4 scale is). A step reads a byte a weight, half of bfloat16's two;
    llama.cpp's SmolLM2 file stores its embedding (the tied LM head) this way. The layer also keeps the
    blocks themselves, to make an exact dense copy from: free when tied (the embedding lookup holds
    them), a second byte a weight for a Q8_0 matrix of its own."""

    def __init__(self, w: Int8Weight, bias: torch.Tensor | None, dtype: torch.dtype):
        u = w.q.view(torch.uint8) ^ 128  # q + 128 in 0..255: the sign bit flipped
        halves = Int4Weight(torch.cat([u >> 4, u & 15], dim=1), torch.cat([16 * w.d, w.d], dim=1),
                            torch.cat([-128 * w.d, torch.zeros_like(w.d)], dim=1))
        super().__init__(halves, bias, dtype)
        self.w = w  # the blocks (shared with the embedding lookup when tied): a dense copy is made from them
        self.in_features = w.q.shape[1]

    def int4_mm(self, rows: torch.Tensor) -> torch.Tensor:
        return super().int4_mm(torch.cat([rows, rows], dim=1))

    def dequantized(self) -> torch.Tensor:
        """The kernel's weight is d (rounded to the activations' dtype, as its scales are) times q, exactly."""
        dtype = self.scales_and_zeros.dtype
        return Int8Weight(self.w.q, self.w.d.to(dtype).float()).dequantize().to(dtype)


class _Dense(nn.Module):
    """F.linear on a plain weight, where oneDNN's packed layout is not to be had (its bfloat16 needs AVX512 or AMX)."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.register_buffer("weight", weight, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


class Int8Linear(nn.Module):
    """`x @ w.T + bias` with w as int8 and one scale per output row (torch's `_weight_int8pack_mm`)."""

    def __init__(self, w: RowInt8Weight, bias: torch.Tensor | None, dtype: torch.dtype):
        super().__init__()
        self.register_buffer("q", w.q, persistent=False)
        self.register_buffer("scale", w.scale.to(dtype), persistent=False)
        self.register_buffer("bias", None if bias is None else bias.to(dtype), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.ops.aten._weight_int8pack_mm(x.reshape(-1, x.shape[-1]), self.q, self.scale)
        out = out.view(*x.shape[:-1], self.q.shape[0])
        return out if self.bias is None else out + self.bias


class QuantEmbedding(nn.Module):
    """An embedding table kept as stored (Q8_0 or 4-bit): a lookup dequantizes only the rows it reads."""

    def __init__(self, w: Int4Weight | Int8Weight, dtype: torch.dtype):
        super().__init__()
        self.w, self.dtype = w, dtype

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.w.dequantize(input_ids).to(self.dtype)


def quantize_weight(w: torch.Tensor, mode: str) -> Int4Weight | RowInt8Weight:
    """A float weight read from safetensors, quantized at load: int4 in groups of 32 or int8 per row."""
    if mode == "int4" and w.shape[1] % GROUP == 0 and w.shape[0] % 16 == 0:
        return Int4Weight.quantize(w)
    return RowInt8Weight.quantize(w)


def resolve_quantization(quantization: str | None, gguf_file: str | None, device: torch.device,
                         dtype: torch.dtype) -> tuple[str, str]:
    """(mode, why): "gguf" (a GGUF file's tensors as stored), "int8" / "int4" (quantized at load) or "none".

    By default a GGUF file runs as stored on a CPU in bfloat16, as llama.cpp runs it (a batch then adds
    dense copies: `DenseCopies`); elsewhere it is dequantized: torch's int4 kernel is a CPU kernel, and
    in float32 a scalar loop.
    """
    if quantization in ("gguf", "int8", "int4") and device.type != "cpu":
        raise ValueError(f"quantization={quantization!r} runs torch's CPU int4/int8 kernels, and device is "
                         f"{device.type!r}: use quantization='none' (GGUF files are then dequantized)")
    if quantization is None and gguf_file and device.type == "cpu" and dtype == torch.bfloat16:
        return "gguf", "the default on a CPU in bfloat16; quantization='none' dequantizes it"
    if quantization in (None, "none"):
        how = "asked for" if quantization == "none" else "the default in this dtype on this device"
        return "none", f"{how}; quantization='gguf' runs it as stored" if gguf_file else ""
    return quantization, "asked for"


def quantized_linear(w: Int4Weight | RowInt8Weight | Int8Weight, dtype: torch.dtype) -> nn.Module | Int8Weight:
    """The layer for a linear weight, built as soon as the weight is whole, so the unpacked form (a byte a
    weight) of one matrix at a time is ever held. A Q8_0 weight runs as two int4 halves in bfloat16
    (`Q8Linear`); in float32, where the int4 kernel is a scalar loop, it stays as it is (to be dequantized)."""
    if isinstance(w, Int4Weight):
        return Int4Linear(w, None, dtype)
    if isinstance(w, Int8Weight):
        return Q8Linear(w, None, dtype) if dtype == torch.bfloat16 else w
    return Int8Linear(w, None, dtype)


HELD = {Q8Linear: "Q8_0 as two int4 halves", Int4Linear: "int4 (group 32)", Int8Linear: "int8 (per row)"}


def install_quantized(model: nn.Module, state: dict, dtype: torch.dtype) -> Counter:
    """Swap in a quantized layer for every quantized weight of `state` (a built layer from `quantized_linear`,
    or the embedding's blocks), taking it and its bias out of `state`; a weight with no layer (a Q8_0 weight
    in float32) goes back into `state` dequantized. Returns what went where."""
    held = Counter()
    for name in [n for n, w in state.items() if not isinstance(w, torch.Tensor)]:
        w, path = state.pop(name), name.removesuffix(".weight")
        parent, leaf = model.get_submodule(path.rpartition(".")[0]) if "." in path else model, path.rpartition(".")[2]
        if name == "embed_tokens.weight":
            model.embed_tokens = QuantEmbedding(w, dtype)
            held["embedding kept as stored"] += 1
            head = quantized_linear(w, dtype) if model.tie_word_embeddings else None  # the logits on the same blocks
            if isinstance(head, Int8Weight):  # float32: a dequantized copy for the logits
                model.lm_head = nn.Linear(w.q.shape[1], w.q.shape[0], bias=False, device="meta")
                state["lm_head.weight"] = w.dequantize().to(dtype)
                held["logits through a dequantized copy"] += 1
            elif head is not None:
                model.lm_head = head
                held[f"logits through the stored blocks ({HELD[type(head)]})"] += 1
            continue
        if isinstance(w, Int8Weight):
            state[name] = w.dequantize().to(dtype)
            held["Q8_0 dequantized"] += 1
            continue
        bias = state.pop(path + ".bias", None)
        w.bias = None if bias is None else bias.to(dtype)
        setattr(parent, leaf, w)
        held[HELD[type(w)]] += 1
    return held


def describe_weights(mode: str, why: str, held: Counter, dequantized: Counter, dtype: torch.dtype) -> str:
    """The startup line's words on how the weights are held."""
    name = str(dtype).removeprefix("torch.")
    if mode == "none":
        return why and f"weights dequantized to {name} ({why})"
    parts = [f"{n} linear layers {kind}" if kind in HELD.values() else f"{kind}" + (f" x{n}" if n > 1 else "")
             for kind, n in held.items()]
    # a bare type name ("Q6_K") has no exact int4 form; "Q8_0 expert", "Q4_0 router" say why they run in floats
    parts += [f"{n} {kind} tensors dequantized" + ("" if " " in kind else " (no exact int4 form)")
              for kind, n in dequantized.items()]
    how = "as stored" if mode == "gguf" else "quantized at load"
    return f"weights {how} ({why}): " + ", ".join(parts)


def int4_identity_dequantize(layer: Int4Linear, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The weight exactly as the kernel sees it: the identity matrix multiplied through it ([N, K], K the
    kernel's: for a `Q8Linear` both halves side by side). A matmul of K rows per layer, slow for a whole model:
    `int4_dequantize` reads the nibbles instead, and comes here only where the layout is not the known one."""
    eye = torch.eye(2 * layer.packed.shape[1], dtype=dtype)
    return torch.ops.aten._weight_int4pack_mm_for_cpu(eye, layer.packed, GROUP, layer.scales_and_zeros.to(dtype)).T


def kernel_nibbles(packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """q [n, k] (0..15, uint8) read back out of the kernel's layout: rows in blocks of 64, each block stored
    k-major with row j in the low nibble and row j + 32 in the high one; the last n % 64 rows k-major with
    rows 2i and 2i + 1 in one byte. `_int4_layout_known` checks that this build packs so."""
    b = packed.view(torch.uint8).reshape(-1)
    full = n // 64 * 64
    parts = []
    if full:
        x = b[: full * k // 2].view(full // 64, k, 32)
        parts.append(torch.cat([x & 15, x >> 4], dim=2).transpose(1, 2).reshape(full, k))
    if n > full:
        x = b[full * k // 2 :].view(k, (n - full) // 2)
        parts.append(torch.stack([x & 15, x >> 4], dim=2).reshape(k, n - full).T)
    return torch.cat(parts)


@functools.cache
def _int4_layout_known() -> bool:
    """The packing is the kernel's own business (it may differ between CPU builds): probe it once."""
    q = torch.randint(0, 16, (144, 64), dtype=torch.int32, generator=torch.Generator().manual_seed(0))
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    return torch.equal(kernel_nibbles(packed, 144, 64).int(), q)


def int4_dequantize(layer: Int4Linear, dtype: torch.dtype) -> torch.Tensor:
    """`int4_identity_dequantize`'s values, bit for bit, with no matmul: (q - 8) * scale + zero in float32. With
    bfloat16 scales q - 8 times one is exact, so the one rounding is the kernel's own; with float32 ones the
    products round as the kernel's do (the tests compare both routes)."""
    n, k = layer.packed.shape[0], 2 * layer.packed.shape[1]
    if not _int4_layout_known():
        return int4_identity_dequantize(layer, dtype).contiguous()
    q = kernel_nibbles(layer.packed, n, k).view(n, k // GROUP, GROUP).float() - 8
    scale, zero = layer.scales_and_zeros.float().permute(2, 1, 0).contiguous()  # [N, K / 32] each
    return torch.addcmul(zero[..., None], q, scale[..., None]).view(n, k).to(dtype)
