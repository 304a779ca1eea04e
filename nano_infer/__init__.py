"""nano_infer: an LLM inference engine built stage by stage, small enough to read."""
import logging

# The engine's startup line (dtype and KV capacity, and why) shows on stderr by default, as vLLM's does;
# logging.getLogger("nano_infer").setLevel("WARNING") silences it.
_logger = logging.getLogger(__name__)
if not _logger.handlers:
    _handler = logging.StreamHandler()
    _handler.setFormatter(logging.Formatter("[nano_infer] %(message)s"))
    _logger.addHandler(_handler)
    _logger.setLevel(logging.INFO)
    _logger.propagate = False

from .async_engine import AsyncLLM
from .engine import EngineConfig, LLMEngine
from .llm import LLM
from .models.loader import default_model
from .outputs import CompletionOutput, RequestOutput
from .sampling_params import SamplingParams

__all__ = ["AsyncLLM", "LLM", "CompletionOutput", "EngineConfig", "LLMEngine", "RequestOutput", "SamplingParams", "default_model"]
__version__ = "0.1.0"
