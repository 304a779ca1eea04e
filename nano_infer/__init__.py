"""nano_infer: an LLM inference engine built chapter by chapter, small enough to read."""
import logging
import sys

# The engine's startup line (dtype and KV capacity, and why) shows on stderr by default, as vLLM's does;
# in a Jupyter kernel on stdout, where a status line is not drawn as an error.
# logging.getLogger("nano_infer").setLevel("WARNING") silences it.
_logger = logging.getLogger(__name__)
if not _logger.handlers:
    _handler = logging.StreamHandler(sys.stdout if "ipykernel" in sys.modules else sys.stderr)
    _handler.setFormatter(logging.Formatter("[nano_infer] %(message)s"))
    _logger.addHandler(_handler)
    _logger.setLevel(logging.INFO)
    _logger.propagate = False

from . import beam, spec  # noqa: F401 - their features register with the engine when imported
from .async_engine.async_llm import AsyncLLM
from .beam.params import BeamSearchOutput, BeamSearchParams, BeamSearchSequence
from .cli.arg_utils import AsyncEngineArgs, EngineArgs  # also nano_infer.engine.arg_utils, as vLLM's path
from .config import EngineConfig
from .engine.llm_engine import LLMEngine
from .llm import LLM
from .models.loader import default_model
from .outputs import CompletionOutput, RequestOutput
from .sampling_params import SamplingParams

# vLLM's deeper path for AsyncLLM, with `vllm` swapped (its async streaming example imports it from there)
for _path in ("nano_infer.v1.engine", "nano_infer.v1.engine.async_llm"):
    sys.modules.setdefault(_path, sys.modules[AsyncLLM.__module__])
del _path

__all__ = ["AsyncEngineArgs", "AsyncLLM", "EngineArgs", "BeamSearchOutput", "BeamSearchParams", "BeamSearchSequence", "LLM", "CompletionOutput", "EngineConfig", "LLMEngine", "RequestOutput", "SamplingParams", "default_model"]
__version__ = "0.1.0"
