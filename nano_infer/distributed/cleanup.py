"""vLLM's `cleanup_dist_env_and_memory`, which its examples call between two engines in one script."""
from __future__ import annotations

import gc

import torch


def cleanup_dist_env_and_memory(shutdown_ray: bool = False) -> None:
    """After `del llm`: collect what it held (its tensor-parallel workers stop when their executor is collected)
    and hand cached CUDA memory back. No process group outlives an engine here, and there is no Ray to shut down."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
