"""The engines the AsyncLLM tests compare: a synchronous LLM as the reference, and an AsyncLLM on the same model."""
import pytest

from nano_infer import LLM
from nano_infer.async_engine.async_llm import AsyncLLM


@pytest.fixture(scope="module")
def ref(qwen2_dir):
    return LLM(str(qwen2_dir), dtype="float32")


@pytest.fixture(scope="module")
def allm(qwen2_dir):
    llm = AsyncLLM(str(qwen2_dir), dtype="float32", block_size=4)
    yield llm
    llm.shutdown()
