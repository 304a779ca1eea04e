"""How 4- and 8-bit weights are held: group-wise forms, and llama.cpp's blocks unpacked into them.

llama.cpp's Q4_0 / Q4_1 / Q4_K blocks are groups of 32 weights with one scale and one offset
(w = d * q + m, q in 0..15); Q8_0 is 32 int8 values and one scale (w = d * q). Unpacking a block
reorders nibbles and bytes, it never rounds: `quantization.py` multiplies by these forms as they are.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

GROUP = 32  # weights per scale (and zero): llama.cpp's block of Q4_0, Q4_1, Q8_0 and Q4_K's sub-blocks


@dataclass
class Int4Weight:
    """w = d * q + m per group of 32 along the input: q uint8 [N, K] in 0..15, d and m float32 [N, K / 32]."""
    q: torch.Tensor
    d: torch.Tensor
    m: torch.Tensor

    @staticmethod
    def cat(parts: list[Int4Weight]) -> Int4Weight:
        """Rows end to end: the fused qkv / gate_up weight from its parts (a group never spans two rows)."""
        return Int4Weight(*(torch.cat([getattr(p, f) for p in parts]) for f in ("q", "d", "m")))

    @staticmethod
    def quantize(w: torch.Tensor) -> Int4Weight:
        """Round a float weight to 16 levels between each group's min and max (Q4_1's rule)."""
        g = w.float().view(w.shape[0], -1, GROUP)
        lo, hi = g.amin(-1), g.amax(-1)
        d = (hi - lo) / 15
        q = ((g - lo.unsqueeze(-1)) / d.clamp_min(1e-12).unsqueeze(-1)).round().clamp(0, 15)
        return Int4Weight(q.to(torch.uint8).view(w.shape), d, lo)

    def dequantize(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        q, d, m = (self.q, self.d, self.m) if rows is None else (self.q[rows], self.d[rows], self.m[rows])
        return (q.view(q.shape[0], -1, GROUP).float() * d.unsqueeze(-1) + m.unsqueeze(-1)).view(q.shape)


@dataclass
class RowInt8Weight:
    """w = scale * q with one scale per output row: q int8 [N, K], scale float32 [N] (torch's int8 kernel's form)."""
    q: torch.Tensor
    scale: torch.Tensor

    @staticmethod
    def quantize(w: torch.Tensor) -> RowInt8Weight:
        scale = w.float().abs().amax(dim=1).clamp_min(1e-12) / 127
        return RowInt8Weight((w.float() / scale.unsqueeze(1)).round().clamp(-127, 127).to(torch.int8), scale)

    def dequantize(self) -> torch.Tensor:
        return self.q.float() * self.scale.unsqueeze(1)


@dataclass
class Int8Weight:
    """w = d * q per group of 32: q int8 [N, K], d float32 [N, K / 32] (llama.cpp's Q8_0)."""
    q: torch.Tensor
    d: torch.Tensor

    @staticmethod
    def cat(parts: list[Int8Weight]) -> Int8Weight:
        return Int8Weight(torch.cat([p.q for p in parts]), torch.cat([p.d for p in parts]))

    def dequantize(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        q, d = (self.q, self.d) if rows is None else (self.q[rows], self.d[rows])
        return (q.view(q.shape[0], -1, GROUP).float() * d.unsqueeze(-1)).view(q.shape)


def _nibbles(qs: np.ndarray) -> torch.Tensor:
    """[..., 16] bytes -> [..., 32] values: the low nibbles are weights 0-15, the high ones 16-31."""
    qs = torch.from_numpy(np.ascontiguousarray(qs))
    return torch.cat([qs & 15, qs >> 4], dim=-1)


def _f16(b: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(b).view(np.float16)).float().squeeze(-1)


def unpack_q4_0(raw: np.ndarray) -> Int4Weight:
    """Q4_0 rows [N, K / 32 * 18 bytes] (fp16 d, 16 bytes of nibbles): w = d * (q - 8)."""
    b = raw.reshape(raw.shape[0], -1, 18)
    d = _f16(b[..., :2])
    return Int4Weight(_nibbles(b[..., 2:]).view(raw.shape[0], -1), d, -8 * d)


def unpack_q4_1(raw: np.ndarray) -> Int4Weight:
    """Q4_1 rows [N, K / 32 * 20 bytes] (fp16 d, fp16 m, 16 bytes of nibbles): w = d * q + m."""
    b = raw.reshape(raw.shape[0], -1, 20)
    return Int4Weight(_nibbles(b[..., 4:]).view(raw.shape[0], -1), _f16(b[..., :2]), _f16(b[..., 2:4]))


def unpack_q4_k(raw: np.ndarray) -> Int4Weight:
    """Q4_K rows: super-blocks of 256 (fp16 d, fp16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes of
    nibbles) = 8 groups of 32 with w = d * sc * q - dmin * mn; each 32 bytes of nibbles hold two groups."""
    n = raw.shape[0]
    b = raw.reshape(n, -1, 144)
    d, dmin = _f16(b[..., :2]).unsqueeze(-1), _f16(b[..., 2:4]).unsqueeze(-1)
    s = torch.from_numpy(np.ascontiguousarray(b[..., 4:16])).view(n, -1, 3, 4)
    lo, hi, mix = s[:, :, 0], s[:, :, 1], s[:, :, 2]
    sc = torch.cat([lo & 63, (mix & 15) | ((lo >> 2) & 48)], dim=-1).float()
    mn = torch.cat([hi & 63, (mix >> 4) | ((hi >> 2) & 48)], dim=-1).float()
    qs = torch.from_numpy(np.ascontiguousarray(b[..., 16:])).view(n, -1, 4, 1, 32)
    q = torch.cat([qs & 15, qs >> 4], dim=3)  # [n, super-blocks, 4, 2 groups, 32]
    return Int4Weight(q.reshape(n, -1), (d * sc).view(n, -1), (-dmin * mn).view(n, -1))


def unpack_q8_0(raw: np.ndarray) -> Int8Weight:
    """Q8_0 rows [N, K / 32 * 34 bytes] (fp16 d, 32 int8): w = d * q."""
    b = raw.reshape(raw.shape[0], -1, 34)
    q = torch.from_numpy(np.ascontiguousarray(b[..., 2:]).view(np.int8))
    return Int8Weight(q.reshape(raw.shape[0], -1), _f16(b[..., :2]))


UNPACK = {"Q4_0": unpack_q4_0, "Q4_1": unpack_q4_1, "Q4_K": unpack_q4_k, "Q8_0": unpack_q8_0}
