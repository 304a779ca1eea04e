"""A llama.cpp / Ollama GGUF file's tensors, named as transformers names them: dequantized, or as stored.

transformers maps GGUF names (`blk.0.attn_q.weight`) to its own through a model of the
architecture; one built on the meta device costs no memory. llama.cpp's converter permutes the
rows of Llama's q and k weights (its rotary pairs neighbours, transformers' pairs halves); undoing
that moves whole rows, and a quantized block lies within one row, so the blocks move untouched.

The tensor table is read here, not through gguf's GGUFReader: that parses every metadata value
into numpy views first, the tokenizer's whole vocabulary and merges included, which costs
far more than reading the table alone. gguf's own tables give each type's
block size, and gguf's `dequantize` turns blocks into floats, as transformers' loader does.
"""
from __future__ import annotations

import struct
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from .quant_formats import UNPACK

if TYPE_CHECKING:
    from gguf import GGMLQuantizationType

# metadata value types of fixed width (GGUF v2 / v3): u8 i8 u16 i16 u32 i32 f32 bool u64 i64 f64
_WIDTH = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9
_VALUES = {"F32": np.float32, "F16": np.float16}  # types held as values; every other as bytes per row


@dataclass
class GGUFTensor:
    """One tensor of the file, unread until `data` is used: F32 and F16 as values in torch's order of
    dimensions, every other type as its bytes, one row of blocks per output row (as GGUFReader gives them)."""
    name: str
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]  # its elements, in torch's order
    data: np.ndarray


def read_gguf_tensors(path: Path) -> list[GGUFTensor]:
    """The file's tensors, mapped from it: the header and metadata are walked, only the tensor table read."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    blob = np.memmap(path, dtype=np.uint8, mode="r")
    if bytes(blob[:4]) != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file (it does not start with the bytes GGUF)")
    version, n_tensors, n_values = struct.unpack_from("<IQQ", blob, 4)
    if version not in (2, 3):
        raise ValueError(f"{path} is GGUF version {version}; versions 2 and 3 are read")

    def string(pos: int) -> tuple[str, int]:
        (length,) = struct.unpack_from("<Q", blob, pos)
        return bytes(blob[pos + 8:pos + 8 + length]).decode(), pos + 8 + length

    def skip(pos: int, kind: int) -> int:
        if kind in _WIDTH:
            return pos + _WIDTH[kind]
        if kind == _STRING:
            return pos + 8 + struct.unpack_from("<Q", blob, pos)[0]
        if kind != _ARRAY:
            raise ValueError(f"{path} holds a metadata value of unknown type {kind}")
        item, count = struct.unpack_from("<IQ", blob, pos)
        pos += 12
        if item in _WIDTH:
            return pos + count * _WIDTH[item]
        for _ in range(count):
            pos = skip(pos, item)
        return pos

    pos, alignment = 24, 32  # llama.cpp's default alignment
    for _ in range(n_values):
        key, pos = string(pos)
        (kind,) = struct.unpack_from("<I", blob, pos)
        if key == "general.alignment":
            (alignment,) = struct.unpack_from("<I", blob, pos + 4)
        pos = skip(pos + 4, kind)
    table = []
    for _ in range(n_tensors):
        name, pos = string(pos)
        (n_dims,) = struct.unpack_from("<I", blob, pos)
        dims = struct.unpack_from(f"<{n_dims}Q", blob, pos + 4)
        kind, offset = struct.unpack_from("<IQ", blob, pos + 4 + 8 * n_dims)
        pos += 4 + 8 * n_dims + 12
        table.append((name, tuple(reversed(dims)), GGMLQuantizationType(kind), offset))
    start = -(-pos // alignment) * alignment
    tensors = []
    for name, shape, kind, offset in table:
        block, block_bytes = GGML_QUANT_SIZES[kind]
        dtype = _VALUES.get(kind.name, np.uint8)
        held = (*shape[:-1], shape[-1] // block * block_bytes) if dtype is np.uint8 else shape
        size = int(np.prod(held)) * np.dtype(dtype).itemsize
        tensors.append(GGUFTensor(name, kind, shape, blob[start + offset:start + offset + size].view(dtype).reshape(held)))
    return tensors


def _skeleton(config):
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


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


def gguf_tensors(path: Path, config, dequantized: Counter, as_stored: bool):
    """(HF name, tensor) for every tensor of the file. `as_stored`: Q4_0 / Q4_1 / Q4_K as an Int4Weight and
    Q8_0 as an Int8Weight, unpacked but not rounded, any other quantized type dequantized to float32 and
    counted in `dequantized` (type name -> tensors). Otherwise every tensor in float32, dequantized as
    transformers does it. Float tensors are float32 either way."""
    from gguf.quants import dequantize

    names = _gguf_names(config)
    heads = {".attn_q.": config.num_attention_heads, ".attn_k.": config.num_key_value_heads}
    for t in read_gguf_tensors(path):
        if t.name not in names:
            continue
        kind, rows = t.tensor_type.name, t.data
        for part, n_head in heads.items():
            if config.model_type == "llama" and part in t.name:
                rows = _unpermute_rows(rows, n_head)
        if as_stored and kind in UNPACK:
            yield names[t.name], UNPACK[kind](rows)
            continue
        if as_stored and kind not in ("F32", "F16", "BF16"):
            dequantized[kind] += 1
        floats = dequantize(rows, t.tensor_type)  # a new array, or for float types a view of the mapped file
        yield names[t.name], torch.from_numpy(floats if floats.flags.writeable and floats.dtype == np.float32
                                              else np.array(floats, dtype=np.float32))
