"""Few-row matmuls on 4-bit weights, form by form: `python -m nano_infer.bench.int4_kernels`.

A chat's decode step multiplies one row (a few with several chats) by every weight. torch's CPU int4 kernel
unpacks the nibbles and scales them as it multiplies, and at a few rows that work, not the bytes it reads, sets
its time. This times the forms torch has for a few rows beside it, on each matrix shape of SmolLM2-135M and of
Qwen2.5-1.5B, each call on the next of a set of matrices larger than the CPU's caches (a decode step reads each
weight once per token, from memory):

- `int4`: `_weight_int4pack_mm_for_cpu`, bfloat16 rows, a scale and zero per 32 weights (GGUF's Q4 as stored)
- `int8 weight-only`: `_weight_int8pack_mm`, one scale per output row, bfloat16 rows
- `int8 dynamic`: fbgemm's `quantized::linear_dynamic`: each call quantizes the rows to 8 bits (one scale for
  them all) and multiplies 8-bit integers (VNNI on AVX512 CPUs)
- `int8 x int8`: `torch._int_mm` (oneDNN) on rows quantized to 8 bits one scale a row
- `bfloat16`: oneDNN on the weight packed at load (models/packed.py), two bytes a weight

Every form gets the same weight (the 4-bit one, dequantized and quantized again for the 8-bit forms), and the
table gives each one's largest error against float32 beside its time: microseconds a call and the multiply-adds
per second. The 8-bit activations' effect on a model's scores is measured apart (the README gives it).

    python -m nano_infer.bench.int4_kernels
    python -m nano_infer.bench.int4_kernels --rows 1 2 4 --threads 2 --models smollm2 1.5b
"""
from __future__ import annotations

import argparse
import os
import time

import torch

from ..models.packed import can_pack
from ..models.quant_formats import GROUP, Int4Weight
from ..models.quantization import Int4Linear

# (out, in) of each matmul a layer runs (q, k and v together; o; gate and up together; down) and the LM head
MODELS = {
    "smollm2": {"qkv": (960, 576), "o": (576, 576), "gate_up": (3072, 576), "down": (576, 1536), "head": (49152, 576)},
    "1.5b": {"qkv": (2048, 1536), "o": (1536, 1536), "gate_up": (17920, 1536), "down": (1536, 8960)},
}
CACHE_BYTES = 96 << 20  # each form's matrices of one shape fill at least this: more than a CPU's last-level cache


def _int8_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] as int8 with one scale per row."""
    scale = w.abs().amax(1).clamp_min(1e-12) / 127
    return (w / scale[:, None]).round().to(torch.int8), scale


def forms(w4: Int4Weight) -> tuple[dict[str, tuple], torch.Tensor]:
    """Each form's (multiply, weight data) for one 4-bit weight, multiply(x, data) -> [rows, N]; and the weight
    as the int4 kernel sees it, in float32."""
    layer = Int4Linear(w4, None, torch.bfloat16)
    w = layer.dequantized().float()
    q8, scale = _int8_rows(w)
    out = {"int4": (lambda x, m: m(x), layer.int4_mm),
           "int8 weight-only": (lambda x, d: torch.ops.aten._weight_int8pack_mm(x, *d), (q8, scale.to(torch.bfloat16))),
           "int8 x int8": (_int_mm_rows, (q8, scale))}
    if "fbgemm" in torch.backends.quantized.supported_engines:
        torch.backends.quantized.engine = "fbgemm"
        packed = torch.ops.quantized.linear_prepack(torch.quantize_per_channel(
            w, scale.double(), torch.zeros(len(scale), dtype=torch.long), 0, torch.qint8), None)
        out["int8 dynamic"] = (lambda x, p: torch.ops.quantized.linear_dynamic(x.float(), p).to(x.dtype), packed)
    if can_pack(torch.device("cpu"), torch.bfloat16):
        out["bfloat16"] = (lambda x, p: torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], ""),
                           torch.ops.mkldnn._reorder_linear_weight(w.to(torch.bfloat16), 32))
    return out, w


def _int_mm_rows(x: torch.Tensor, data) -> torch.Tensor:
    """Rows quantized to int8 one scale a row, an int8 x int8 -> int32 matmul, both scales after."""
    q8, scale = data
    xs = x.float().abs().amax(1, keepdim=True).clamp_min(1e-12) / 127
    xq = (x.float() / xs).round().to(torch.int8)
    return (torch._int_mm(xq, q8.t()).float() * xs * scale).to(x.dtype)  # q8.t(): [K, N] read row by row of q8


def random_weight(n: int, k: int, generator: torch.Generator) -> Int4Weight:
    q = torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=generator)
    d = torch.rand(n, k // GROUP, generator=generator) * 0.004 + 0.001
    return Int4Weight(q, d, -8 * d)


def time_shape(n: int, k: int, rows: list[int], rounds: int = 5, seed: int = 0) -> dict[str, dict[int, dict]]:
    """form -> rows -> {us, gmacs, error}: the best of `rounds` passes over the set of matrices."""
    generator = torch.Generator().manual_seed(seed)
    copies = max(2, -(-CACHE_BYTES // (n * k)))  # int8 bytes: the 4-bit form's set is then under the cache's
    sets, weights = zip(*(forms(random_weight(n, k, generator)) for _ in range(copies)))
    result = {}
    for name in sets[0]:
        multiply, result[name] = sets[0][name][0], {}
        for m in rows:
            x = torch.randn(m, k, generator=generator).to(torch.bfloat16)
            exact = x.float() @ weights[0].T
            error = ((multiply(x, sets[0][name][1]).float() - exact).abs().max() / exact.abs().max()).item()
            best = float("inf")
            for _ in range(rounds):
                start = time.perf_counter()
                for s in sets:
                    multiply(x, s[name][1])
                best = min(best, (time.perf_counter() - start) / len(sets))
            result[name][m] = dict(us=best * 1e6, gmacs=m * n * k / best / 1e9, error=error)
    return result


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    p.add_argument("--rows", nargs="+", type=int, default=[1, 2, 4])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    out = {}
    print(f"load average {os.getloadavg()[0]:.2f} (a figure taken beside other work is not one); {args.threads} "
          f"threads; us a call (multiply-adds per second), largest error against float32 relative "
          "to the largest output")
    for model in args.models:
        for matrix, (n, k) in MODELS[model].items():
            timed = out[f"{model} {matrix}"] = time_shape(n, k, args.rows, args.rounds)
            for name, by_rows in timed.items():
                cells = "  ".join(f"{m} rows {t['us']:8.0f} us ({t['gmacs']:5.1f} GMAC/s)" for m, t in by_rows.items())
                error = max(t["error"] for t in by_rows.values())
                print(f"{model:8s} {matrix:8s} {n:6d}x{k:<5d} {name:17s} {cells}  error {error:.1e}")
    return out


if __name__ == "__main__":
    main()
