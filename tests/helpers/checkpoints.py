"""The real checkpoints the parity tests read: the tiny chat model shipped in the package, and
SmolLM2-135M-Instruct as a GGUF file (`make models` fetches it into .cache/models)."""
import functools
import os
import shutil
import tempfile
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
    every folder. Reading the file takes transformers most of half a minute (its metadata, then every tensor
    dequantized in numpy), so the first read is saved in transformers' own format beside the file, keyed by the
    file's size and time, and later test processes load that: the same weights, from transformers' own reading."""
    import torch
    from transformers import AutoModelForCausalLM

    stat = GGUF.stat()
    saved = GGUF.parent / f"{GGUF.stem}.transformers-{stat.st_size}-{stat.st_mtime_ns}"
    if not (saved / "config.json").is_file():
        read = AutoModelForCausalLM.from_pretrained(GGUF.parent, gguf_file=GGUF.name, dtype=torch.float32)
        # transformers will not save a model it read from GGUF: the same config and weights in a plain model
        model = AutoModelForCausalLM.from_config(read.config, dtype=torch.float32)
        model.load_state_dict(read.state_dict())
        partial = Path(tempfile.mkdtemp(dir=GGUF.parent))
        model.save_pretrained(partial)
        try:
            partial.rename(saved)  # whole or absent
        except OSError:  # another test process saved it first
            shutil.rmtree(partial)
    return AutoModelForCausalLM.from_pretrained(saved, dtype=torch.float32, attn_implementation="sdpa").eval()
