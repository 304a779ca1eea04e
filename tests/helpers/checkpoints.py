"""The real checkpoints the parity tests read: the tiny chat model shipped in the package, and
SmolLM2-135M-Instruct as a GGUF file (`make models` fetches it into .cache/models)."""
import functools
import os
from pathlib import Path

import nano_infer

ROOT = Path(__file__).resolve().parents[2]
# TINY_MODEL_DIR checks a freshly built model (make_tiny_model.py --out DIR) before it ships.
TINY = Path(os.environ.get("TINY_MODEL_DIR") or Path(nano_infer.__file__).parent / "models" / "tiny")
GGUF = Path(os.environ.get("NANO_INFER_GGUF", ROOT / ".cache" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))

MESSAGES = [
    {"role": "system", "content": "You are HAMLET in Hamlet. Stay in character and answer in Shakespeare's words."},
    {"role": "user", "content": "HORATIO: My lord, I came to see your father's funeral."},
]


@functools.cache
def transformers_gguf():
    """transformers' own model of the GGUF file, dequantized to float32: the oracle of the real-weights tests in
    every folder, read once per test process (~25 s, most of it transformers parsing the file's metadata)."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(GGUF.parent, gguf_file=GGUF.name, dtype=torch.float32,
                                                attn_implementation="sdpa").eval()
