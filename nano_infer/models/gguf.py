"""A llama.cpp / Ollama GGUF file's tensors, named as transformers names them: dequantized, or as stored.

transformers maps GGUF names (`blk.0.attn_q.weight`) to its own through a model of the
architecture; one built on the meta device costs no memory. llama.cpp's converter permutes the
rows of Llama's q and k weights (its rotary pairs neighbours, transformers' pairs halves); undoing
that moves whole rows, and a quantized block lies within one row, so the blocks move untouched.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import torch

from .quantization import UNPACK


def _skeleton(config):
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def gguf_tensors(path: Path, config, dtype: torch.dtype):
    """(HF name, tensor dequantized to `dtype`) for every tensor of the file, through transformers' reader."""
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    yield from load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=_skeleton(config),
                                    torch_dtype=dtype)["tensors"].items()


def _unpermute_rows(rows: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's rotary permutation of q / k rows (transformers' `_reverse_permute_weights`)."""
    r = rows.reshape(n_head, rows.shape[0] // n_head // 2, 2, *rows.shape[1:])
    return r.swapaxes(2, 1).reshape(rows.shape)


def _gguf_names(config) -> dict[str, str]:
    """GGUF tensor name -> transformers' name, from gguf's table for the architecture (built once)."""
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map

    arch = next(a for a, name in MODEL_ARCH_NAMES.items() if name == config.model_type)
    table = get_tensor_name_map(arch, config.num_hidden_layers)
    names = {}
    for hf_name in _skeleton(config).state_dict():
        base, suffix = hf_name.rsplit(".", 1)
        if (gguf_name := table.get_name(base)) is not None:
            names[f"{gguf_name}.{suffix}"] = hf_name
    return names


def gguf_stored_tensors(path: Path, config, dequantized: Counter):
    """(HF name, tensor) for every tensor of the file, with Q4_0 / Q4_1 / Q4_K as an Int4Weight and Q8_0 as an
    Int8Weight, unpacked but not rounded; float tensors as float32; any other type dequantized to float32 and
    counted in `dequantized` (type name -> tensors)."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    names = _gguf_names(config)
    heads = {".attn_q.": config.num_attention_heads, ".attn_k.": config.num_key_value_heads}
    for t in GGUFReader(str(path)).tensors:
        if t.name not in names:
            continue
        kind, rows = t.tensor_type.name, t.data
        for part, n_head in heads.items():
            if config.model_type == "llama" and part in t.name:
                rows = _unpermute_rows(rows, n_head)
        if kind in UNPACK:
            yield names[t.name], UNPACK[kind](rows)
            continue
        if kind not in ("F32", "F16", "BF16"):
            dequantized[kind] += 1
        yield names[t.name], torch.from_numpy(np.array(dequantize(rows, t.tensor_type), dtype=np.float32))
