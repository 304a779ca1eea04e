"""The KV cache in 8 bits (chapter 14): `kv_cache_dtype`, vLLM's name and values, plus "int8".

Each K or V vector (one token, one KV head, `head_dim` numbers) is turned by a fixed orthonormal matrix
(`rotation`, a Hadamard matrix) and then stored as 8-bit values and one float16 scale: scale = amax over the
vector / the format's largest value, value = x / scale rounded (int8) or cast (fp8), read back as value * scale.
One byte an element instead of two (bfloat16) or four (float32), plus two bytes of scale per vector: with
head_dim 64, 66 bytes instead of 128.

Why one scale per token and head rather than per channel (KIVI and KVQuant give keys per-channel scales, because a
few channels of K carry outliers): a paged block fills one token at a time, and a decode step writes one slot. A
per-channel scale of a block would have to be re-derived (and the block's earlier tokens re-quantized) whenever a
new token's channel exceeds it, or the block's unfinished tail kept in full precision (KIVI's residual group) with
a second read path, and a token's keys would then change under the tokens after it when its block closes. A
per-token scale is final the moment the token is written, so writing stays one scatter and reading one gather plus
a multiply, for every attention path, and every feature that moves blocks moves bytes that mean the same anywhere.
(The engine does keep each running sequence's open block exact beside the pool, kv/open_blocks.py, but for
accuracy: the rounding of the keys nearest a query costs the most. The pool's bytes stay final when written.)

Why the rotation: an outlier channel sets every token's scale, so the other channels of the token are rounded to a
step sized for the outlier. A Hadamard matrix (entries +-1/sqrt(head_dim)) spreads each channel over all of them,
so the rotated vector has no outlier and its step is sized for the vector's length instead. Being orthonormal it
costs attention nothing in exactness: q . k = (q R) . (k R), and softmax(q K^T) V = (softmax((q R)(K R)^T) (V R)) R^T,
so the pool keeps K R and V R and attention turns each query into the rotated basis and its output back (one small
matmul per query, none per cached key). It needs no calibration data: the same matrix for every model.
"""
from __future__ import annotations

import functools
import math

import torch

from ..config import KV_CACHE_DTYPES

# each format's stored element type and the largest magnitude it holds (what amax maps to)
_FORMATS = {
    "int8": (torch.int8, 127.0),
    "fp8_e4m3": (torch.float8_e4m3fn, torch.finfo(torch.float8_e4m3fn).max),  # 448
    "fp8_e5m2": (torch.float8_e5m2, torch.finfo(torch.float8_e5m2).max),  # 57344
}
SCALE_DTYPE = torch.float16
# what a quantized pool's bytes are kept as: every 8-bit format, viewed as its own dtype to convert (CPU torch
# has no index_copy_ for float8)
CONTAINER_DTYPE = torch.int8
# the scales kept: a zero (or tiny) vector must not divide by zero nor round its scale to 0 in float16, and a
# vector past float16's range saturates at the format's max instead of turning into inf and NaN
MIN_SCALE, MAX_SCALE = torch.finfo(SCALE_DTYPE).tiny, torch.finfo(SCALE_DTYPE).max


def canonical(kv_cache_dtype: str) -> str:
    """"fp8" is vLLM's alias of "fp8_e4m3"; an unknown name is a ValueError that lists the known ones."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype={kv_cache_dtype!r} is unknown: use one of {', '.join(KV_CACHE_DTYPES)}")
    return "fp8_e4m3" if kv_cache_dtype == "fp8" else kv_cache_dtype


def is_quantized(kv_cache_dtype: str) -> bool:
    return canonical(kv_cache_dtype) != "auto"


def storage_dtype(kv_cache_dtype: str, model_dtype: torch.dtype | None = None) -> torch.dtype:
    """The element type a K/V value is kept in: the model's own for "auto", else int8 or a float8."""
    name = canonical(kv_cache_dtype)
    if name == "auto":
        if model_dtype is None:
            raise ValueError("kv_cache_dtype='auto' stores the model's dtype: pass model_dtype")
        return model_dtype
    return _FORMATS[name][0]


def format_max(kv_cache_dtype: str) -> float:
    """The largest magnitude the format holds: 127 for int8, 448 for e4m3, 57344 for e5m2."""
    return _FORMATS[canonical(kv_cache_dtype)][1]


def quantize(x: torch.Tensor, kv_cache_dtype: str) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., head_dim] -> (values [..., head_dim] in storage_dtype, scales [...] in float16).

    The scale is rounded to float16 before dividing, so dequantize multiplies by exactly the scale that
    quantized: the only error left is the rounding of each value (and the clamp at the format's max, which
    the float16 rounding of the scale can reach by a hair)."""
    store, qmax = _FORMATS[canonical(kv_cache_dtype)]
    amax = x.abs().amax(dim=-1).float()
    scales = (amax / qmax).clamp(MIN_SCALE, MAX_SCALE).to(SCALE_DTYPE)
    scaled = (x.float() / scales.float().unsqueeze(-1)).clamp(-qmax, qmax)
    if store == torch.int8:
        scaled = scaled.round()
    return scaled.to(store), scales


def dequantize(values: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """values [..., head_dim] (int8 or float8), scales [...] -> values * scale, in `dtype` (the model's).

    int8 times a `dtype` tensor converts inside the multiply (type promotion): one pass over the values
    instead of a conversion and then a multiply, the same numbers. torch promotes no float8, so those convert first."""
    scales = scales.to(dtype).unsqueeze(-1)
    return values * scales if values.dtype == torch.int8 else values.to(dtype) * scales


@functools.lru_cache(maxsize=None)
def _hadamard(n: int) -> torch.Tensor:
    """Sylvester's n x n matrix of +-1 (n a power of two), rows orthogonal, in float64."""
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)])
    return h


def rotation(head_dim: int, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> torch.Tensor:
    """The orthonormal [head_dim, head_dim] matrix R every 8-bit K/V vector is multiplied by before it is quantized.

    A normalised Hadamard matrix; for a head_dim that is no power of two (80, 96, 112...), Hadamard blocks of its
    binary digits down the diagonal (96 = 64 + 32), still orthonormal. R @ R.T is the identity, so x @ R @ R.T is x."""
    sizes = [1 << b for b in reversed(range(head_dim.bit_length())) if head_dim >> b & 1]
    blocks = [_hadamard(n) / math.sqrt(n) for n in sizes]
    return torch.block_diag(*blocks).to(device=device, dtype=dtype)


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, model_dtype: torch.dtype,
                       kv_cache_dtype: str = "auto") -> int:
    """K and V, every layer: layers x 2 x kv_heads x (head_dim x bytes per element + bytes of its scale).

    The number the pool is sized by: a KV budget in bytes over this is the tokens it holds."""
    if not is_quantized(kv_cache_dtype):
        per_vector = head_dim * model_dtype.itemsize
    else:
        per_vector = head_dim * storage_dtype(kv_cache_dtype).itemsize + SCALE_DTYPE.itemsize
    return num_layers * 2 * num_kv_heads * per_vector
