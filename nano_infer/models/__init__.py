"""Model loading and the Llama-family forward pass."""
from .llama import CausalLM
from .loader import TINY_MODEL_DIR, default_model, load_model, resolve_model_dir

__all__ = ["CausalLM", "TINY_MODEL_DIR", "default_model", "load_model", "resolve_model_dir"]
