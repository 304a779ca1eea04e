"""The models the benchmarks run and each one's workload sizes: what a --model value names.

Its own module because every benchmark entry point (`python -m nano_infer.bench`, `.profile`,
`.decode`) turns a --model value into a checkpoint the same way; with it here they import it
and none imports another's `__main__`.
"""
from __future__ import annotations

from ..models.loader import default_model, resolve_model_dir
from .random_model import QWEN2_5_0_5B, QWEN2_5_1_5B, SMOLLM2_135M, random_model

SHAPES = {"smollm2-135m-shape": SMOLLM2_135M, "qwen2.5-0.5b-shape": QWEN2_5_0_5B, "qwen2.5-1.5b-shape": QWEN2_5_1_5B}
DTYPES = ["float32", "bfloat16"]
# per model: request counts, length ranges, rounds, dtypes, and the one-chat latency case (prompt, outputs).
# Chat-length prompts for the real shapes: a system prompt and a question, answers of a paragraph. Static
# batches run one after another, so past `static_max_requests` their tokens/s would not change: left out.
PRESETS = {
    "default": dict(requests=[32, 128], prompt_len=(16, 192), output_len=(32, 96), rounds=2, dtypes=DTYPES,
                    latency=(128, 64)),
    "smollm2-135m-shape": dict(requests=[32, 128], prompt_len=(48, 192), output_len=(32, 64), rounds=2, dtypes=DTYPES,
                               latency=(128, 48), static_max_requests=32),
    "qwen2.5-0.5b-shape": dict(requests=[32], prompt_len=(48, 128), output_len=(16, 32), rounds=1, dtypes=DTYPES,
                               latency=(128, 24)),
    "qwen2.5-1.5b-shape": dict(requests=[64, 256], prompt_len=(48, 192), output_len=(32, 64), rounds=1,
                               dtypes=["bfloat16"], latency=(128, 48), static_max_requests=64),
    "quick": dict(requests=[8], prompt_len=(16, 64), output_len=(8, 16), rounds=1, dtypes=["auto"], latency=(16, 6)),
}


def model_folder(name: str) -> tuple[str, str]:
    """(checkpoint folder or .gguf file, preset name) for a --model value."""
    if name == "default":
        return str(resolve_model_dir(default_model())), "default"
    if name in SHAPES:
        print(f"building (or reusing) a random-weight {name} model ...", flush=True)
        return str(random_model(resolve_model_dir(default_model()), SHAPES[name], name)), name
    return name, "default"
