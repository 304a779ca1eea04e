"""nano_infer: an LLM inference engine built stage by stage, small enough to read."""
from .async_engine import AsyncLLM
from .engine import EngineConfig, LLMEngine
from .llm import LLM
from .models.loader import default_model
from .outputs import CompletionOutput, RequestOutput
from .sampling_params import SamplingParams

__all__ = ["AsyncLLM", "LLM", "CompletionOutput", "EngineConfig", "LLMEngine", "RequestOutput", "SamplingParams", "default_model"]
__version__ = "0.1.0"
