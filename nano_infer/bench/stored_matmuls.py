"""Every matmul of one decode step of a model's shape, as a GGUF file stores them, on random weights.

Chapter 13 times the step's matmuls at three sizes (SmolLM2-135M and Qwen2.5-0.5B's and 1.5B's shapes) without
a file of each: the int4 kernel's time depends on the matrices' shapes, not on their values. The forms are those
of SmolLM2-135M-Instruct.Q4_1.gguf (`make models`) and of the shaped files `bench.llamacpp --shape` writes:
every layer's matrices in Q4_1 (an `Int4Linear`: group 32, a scale and a minimum), the embedding tied to the LM
head in Q8_0 (a `Q8Linear`: the int4 kernel on both halves of each byte). Each layer gets matrices of its own, as
in a model: a weight read once a step is read from memory, not from a cache that held it since the last layer.
"""
from __future__ import annotations

import torch

from ..models.quant_formats import GROUP, Int8Weight
from ..models.quantization import Int4Linear, Q8Linear
from .int4_kernels import random_weight

Q4_1_BYTES, Q8_0_BYTES = 20 / GROUP, 34 / GROUP  # bytes a weight in the file: a block's scales with its values


def layer_matmuls(shape: dict) -> list[tuple[int, int]]:
    """(out, in) of the matmuls of one decoder layer: q, k and v as one, o, gate and up as one, down."""
    hidden, heads = shape["hidden_size"], shape["num_attention_heads"]
    head_dim = shape.get("head_dim") or hidden // heads
    qkv = (heads + 2 * shape["num_key_value_heads"]) * head_dim
    return [(qkv, hidden), (heads * head_dim, hidden), (2 * shape["intermediate_size"], hidden),
            (hidden, shape["intermediate_size"])]


class StoredMatmuls:
    """A step's matmuls of `shape` (random_model's dicts) on random Q4_1 layers and a Q8_0 LM head, in `dtype`."""

    def __init__(self, shape: dict, dtype: torch.dtype = torch.bfloat16, seed: int = 0):
        gen = torch.Generator().manual_seed(seed)
        self.layers: list[Int4Linear] = []
        self.weights = 0
        for out_features, in_features in layer_matmuls(shape) * shape["num_hidden_layers"]:
            self.layers.append(Int4Linear(random_weight(out_features, in_features, gen), None, dtype))
            self.weights += out_features * in_features
        vocab, hidden = shape["vocab_size"], shape["hidden_size"]
        q8 = torch.randint(-128, 128, (vocab, hidden), dtype=torch.int8, generator=gen)
        d8 = torch.rand(vocab, hidden // GROUP, generator=gen) / 100
        self.layers.append(Q8Linear(Int8Weight(q8, d8), None, dtype))
        self.stored_bytes = self.weights * Q4_1_BYTES + vocab * hidden * Q8_0_BYTES
        self.weights += vocab * hidden
        self.rows = {k: torch.randn(1, k, dtype=dtype, generator=gen) for k in {m.in_features for m in self.layers}}

    @torch.inference_mode()
    def __call__(self) -> None:
        """Every matmul once, on one row: what a decode step of one sequence multiplies."""
        for m in self.layers:
            m(self.rows[m.in_features])
