"""A decode step's matmuls as a GGUF file stores them, on random weights (bench/stored_matmuls.py, chapter 13)."""
import pytest
import torch
from transformers import Qwen2Config

from nano_infer.bench.llamacpp import DEFAULT_GGUF, gguf_weight_bytes
from nano_infer.bench.random_model import QWEN2_5_1_5B, SMOLLM2_135M
from nano_infer.bench.roofline import matmul_params
from nano_infer.bench.stored_matmuls import StoredMatmuls, layer_matmuls


@pytest.mark.parametrize("shape", [SMOLLM2_135M, QWEN2_5_1_5B], ids=["smollm2", "qwen2.5-1.5b"])
def test_a_layers_matmuls_and_the_head_are_every_weight_the_roofline_counts(shape):
    config = Qwen2Config(**{k: v for k, v in shape.items() if k != "model_type"})
    per_layer = sum(out_features * in_features for out_features, in_features in layer_matmuls(shape))
    assert per_layer * shape["num_hidden_layers"] + shape["vocab_size"] * shape["hidden_size"] == matmul_params(config)


def test_the_bytes_are_the_files_and_every_matmul_runs_on_one_row():
    """SmolLM2's file holds its matmuls in Q4_1 and its tied embedding in Q8_0, besides a few float32 norms."""
    if not DEFAULT_GGUF.is_file():
        pytest.skip(f"{DEFAULT_GGUF} is missing: `make models` fetches it (make test does)")
    step = StoredMatmuls(SMOLLM2_135M)
    assert len(step.layers) == 4 * SMOLLM2_135M["num_hidden_layers"] + 1
    assert step.stored_bytes == pytest.approx(gguf_weight_bytes(DEFAULT_GGUF)["stored_bytes"], rel=0.005)
    outputs = [m(step.rows[m.in_features]) for m in step.layers]
    assert [o.shape for o in outputs] == [(1, m.out_features) for m in step.layers]
    assert all(o.dtype == torch.bfloat16 and torch.isfinite(o).all() for o in outputs)
