"""A llama.cpp / Ollama GGUF file's tensors, named as transformers names them: dequantized, or as stored.

transformers maps GGUF names (`blk.0.attn_q.weight`) to its own through a model of the
architecture; one built on the meta device costs no memory. llama.cpp's converter permutes the
rows of Llama's q and k weights (its rotary pairs neighbours, transformers' pairs halves); undoing
that moves whole rows, and a quantized block lies within one row, so the blocks move untouched.

The tensor table is read here, not through gguf's GGUFReader: that parses every metadata value
into numpy views first, the tokenizer's whole vocabulary and merges included, which costs
far more than reading the table alone. gguf's own tables give each type's
block size, and gguf's `dequantize` turns blocks into floats, as transformers' loader does.

A Mixture-of-Experts file (qwen3moe) stacks each layer's experts, one tensor per projection [E, out, in];
they are handed to the loader one expert at a time, as a safetensors checkpoint holds them, and always in
floats (the as-stored layers are 2-D). A few config fields transformers does not read are read here.
"""
from __future__ import annotations

import re
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

# metadata value types of fixed width (GGUF v2 / v3), as struct formats: u8 i8 u16 i16 u32 i32 f32 bool u64 i64 f64
_FORMAT = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_WIDTH = {kind: struct.calcsize(f"<{fmt}") for kind, fmt in _FORMAT.items()}
_STRING, _ARRAY = 8, 9
_FUSED = re.compile(r"\.(attn_[qkv]|ffn_gate|ffn_up)\.")  # parts of one fused weight: a layer's q/k/v, dense gate/up
_VALUES = {"F32": np.float32, "F16": np.float16}  # types held as values; every other as bytes per row


@dataclass
class GGUFTensor:
    """One tensor of the file, unread until `data` is used: F32 and F16 as values in torch's order of
    dimensions, every other type as its bytes, one row of blocks per output row (as GGUFReader gives them)."""
    name: str
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]  # its elements, in torch's order
    data: np.ndarray


def _header(blob: np.ndarray, path: Path) -> tuple[int, int]:
    """(number of tensors, number of metadata entries)."""
    if bytes(blob[:4]) != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file (it does not start with the bytes GGUF)")
    version, n_tensors, n_values = struct.unpack_from("<IQQ", blob, 4)
    if version not in (2, 3):
        raise ValueError(f"{path} is GGUF version {version}; versions 2 and 3 are read")
    return n_tensors, n_values


def _metadata(blob: np.ndarray, path: Path):
    """(key, value type, position of its value) for each metadata entry in the file's order, then (None, None,
    position of the tensor table). Values are skipped, not parsed: a caller reads the few it wants."""
    n_values = _header(blob, path)[1]

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

    pos = 24
    for _ in range(n_values):
        key, pos = _string(blob, pos)
        (kind,) = struct.unpack_from("<I", blob, pos)
        yield key, kind, pos + 4
        pos = skip(pos + 4, kind)
    yield None, None, pos


def _string(blob: np.ndarray, pos: int) -> tuple[str, int]:
    (length,) = struct.unpack_from("<Q", blob, pos)
    return bytes(blob[pos + 8:pos + 8 + length]).decode(), pos + 8 + length


def read_gguf_number(path: Path, key: str) -> int | float | None:
    """One number (or bool) of the file's metadata, None where the file lacks it. The walk stops at the key: in
    llama.cpp's files an architecture's entries come before the tokenizer's long arrays."""
    blob = np.memmap(path, dtype=np.uint8, mode="r")
    for name, kind, pos in _metadata(blob, path):
        if name == key:
            if kind not in _FORMAT:
                raise ValueError(f"{path}: metadata {key} is of type {kind}, not a number")
            return struct.unpack_from(f"<{_FORMAT[kind]}", blob, pos)[0]
    return None


def read_gguf_tensors(path: Path) -> list[GGUFTensor]:
    """The file's tensors, mapped from it: the header and metadata are walked, only the tensor table read."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    blob = np.memmap(path, dtype=np.uint8, mode="r")
    n_tensors = _header(blob, path)[0]
    alignment = 32  # llama.cpp's default alignment
    for key, kind, pos in _metadata(blob, path):
        if key == "general.alignment":
            (alignment,) = struct.unpack_from("<I", blob, pos)
    table = []
    for _ in range(n_tensors):
        name, pos = _string(blob, pos)
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
    """GGUF tensor name -> transformers' name, from gguf's table for the architecture (built once). transformers
    holds a layer's experts stacked as `experts.gate_up_proj` and `experts.down_proj`, which the table does not
    name; the file stacks gate, up and down apart, named in the table under per-projection names. Those map to
    the name of one expert's weight with a `{}` for its number."""
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map

    arch = next(a for a, name in MODEL_ARCH_NAMES.items() if name == config.model_type.replace("_", ""))
    table = get_tensor_name_map(arch, config.num_hidden_layers)
    names = {}
    for hf_name in _skeleton(config).state_dict():
        base, suffix = hf_name.rsplit(".", 1)
        if base.endswith(".experts"):
            for proj in ("gate", "up") if suffix == "gate_up_proj" else ("down",):
                if (gguf_name := table.get_name(f"{base}.{proj}_proj")) is not None:
                    names[f"{gguf_name}.weight"] = f"{base}.{{}}.{proj}_proj.weight"
        elif (gguf_name := table.get_name(base)) is not None:
            names[f"{gguf_name}.{suffix}"] = hf_name
    return names


def _runs_as_stored(hf_name: str) -> bool:
    """Whether the loader can run this weight as stored: a 2-D linear weight or the embedding, not the router."""
    return hf_name.endswith(("_proj.weight", "embed_tokens.weight", "lm_head.weight"))


def _fused_group(gguf_name: str) -> str:
    """The weight the loader fuses this tensor into (a layer's q/k/v or dense gate/up), or the tensor's own name."""
    return _FUSED.sub(lambda m: ".attn_qkv." if m[1].startswith("attn") else ".ffn_gate_up.", gguf_name)


def _stored_form(kind: str) -> str:
    """How the loader holds a tensor of this type as stored: Q8_0's blocks, int4 groups, or floats."""
    return "Q8_0" if kind == "Q8_0" else "int4" if kind in UNPACK else "floats"


def _mixed(tensors: list[GGUFTensor]) -> set[str]:
    """Names of the tensors fused with a part of another form as stored: such a weight is held in floats, as no
    as-stored layer joins two forms. llama.cpp's Q4_K_M files store some layers' attn_v in Q6_K beside attn_q and
    attn_k in Q4_K."""
    forms: dict[str, set[str]] = {}
    for t in tensors:
        forms.setdefault(_fused_group(t.name), set()).add(_stored_form(t.tensor_type.name))
    return {t.name for t in tensors if len(forms[_fused_group(t.name)]) > 1}


def _floats(rows: np.ndarray, tensor_type) -> torch.Tensor:
    from gguf.quants import dequantize

    floats = dequantize(rows, tensor_type)  # a new array, or for float types a view of the mapped file
    return torch.from_numpy(floats if floats.flags.writeable and floats.dtype == np.float32
                            else np.array(floats, dtype=np.float32))


def gguf_tensors(path: Path, config, dequantized: Counter, as_stored: bool):
    """(HF name, tensor) for every tensor of the file. `as_stored`: Q4_0 / Q4_1 / Q4_K as an Int4Weight and
    Q8_0 as an Int8Weight, unpacked but not rounded, any other quantized type dequantized to float32 and
    counted in `dequantized` (type name -> tensors). Otherwise every tensor in float32, dequantized as
    transformers does it. Float tensors are float32 either way.

    A layer's stacked experts [E, out, in] come out one expert at a time under transformers' per-expert names
    (the loader stacks them again, as it does a checkpoint's), always dequantized: no as-stored kernel runs a
    3-D weight. With `as_stored` a quantized stack is counted as "<type> expert", a quantized router as
    "<type> router", and a part of a fused weight whose parts differ in form as stored (`_mixed`) is dequantized
    and counted as "<type> fused with another type"."""
    names = _gguf_names(config)
    heads = {".attn_q.": config.num_attention_heads, ".attn_k.": config.num_key_value_heads}
    tensors = read_gguf_tensors(path)
    mixed = _mixed(tensors) if as_stored else set()
    for t in tensors:
        if t.name not in names:
            continue
        kind, rows, hf_name = t.tensor_type.name, t.data, names[t.name]
        for part, n_head in heads.items():
            if config.model_type == "llama" and part in t.name:
                rows = _unpermute_rows(rows, n_head)
        stacked = "{}" in hf_name
        floats_because = ("expert" if stacked else "router" if not _runs_as_stored(hf_name)
                          else "fused with another type" if t.name in mixed else "")
        if as_stored and kind in UNPACK and not floats_because:
            yield hf_name, UNPACK[kind](rows)
            continue
        if as_stored and kind not in ("F32", "F16", "BF16"):
            dequantized[f"{kind} {floats_because}".rstrip()] += 1
        floats = _floats(rows, t.tensor_type)
        if not stacked:
            yield hf_name, floats
            continue
        if floats.dim() != 3 or floats.shape[0] != config.num_experts:
            raise ValueError(f"{path}: {t.name} has shape {tuple(floats.shape)}; [num_experts={config.num_experts}, "
                             "out, in] was expected (one matrix per expert)")
        for e, weight in enumerate(floats):
            yield hf_name.format(e), weight


# config fields transformers leaves at its class's default where the file says them: model_type -> field -> key
_UNREAD = {"qwen3_moe": {"moe_intermediate_size": "qwen3moe.expert_feed_forward_length"}}


def complete_config(config, path: Path):
    """transformers' config of the file with the fields it does not read taken from the file. transformers
    (5.x) reads no `expert_feed_forward_length` for qwen3moe, so its experts' width would be Qwen3MoeConfig's
    default whatever the file holds."""
    for field, key in _UNREAD.get(config.model_type, {}).items():
        if (value := read_gguf_number(path, key)) is None:
            raise ValueError(f"{path} has no {key}: {field} (the width of each expert) is not known")
        setattr(config, field, value)
    return config
