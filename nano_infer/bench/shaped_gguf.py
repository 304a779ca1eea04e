"""A GGUF file of a larger model's shape with random weights and SmolLM2's tokenizer (`bench.llamacpp --shape`).

The one-chat comparison with llama.cpp needs the same file in both engines. A real Qwen2.5-0.5B or 1.5B file is a
download; a decode step's time depends on the shape and the storage format, not on the weights' values, so a file
of the shape with random weights times like the real one. It is written here with the `gguf` package (llama.cpp's
own writer), once, into .cache/models/:

- the architecture `qwen2` with the shape's hyperparameters (random_model's QWEN2_5_0_5B / QWEN2_5_1_5B), q/k/v
  biases included, the embedding tied to the LM head as in both real models;
- the matrices of every layer in Q4_1 and the embedding in Q8_0, the types SmolLM2-135M-Instruct.Q4_1.gguf (`make
  models`) holds; norms and biases in F32;
- the tokenizer of that SmolLM2 file, its vocabulary padded with unused tokens to the shape's 151,936 rows, so
  both engines read prompts the same way and the embedding and LM head keep the real model's size (a large share
  of a small model's bytes).
"""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from .random_model import QWEN2_5_0_5B, QWEN2_5_1_5B

SHAPES = {"0.5b": QWEN2_5_0_5B, "1.5b": QWEN2_5_1_5B}
ARCH = "qwen2"
UNUSED = 5  # gguf's TokenType.UNUSED: a padding row of the vocabulary


def shaped_gguf_path(shape: str, source: str | Path) -> Path:
    """Where the file of `shape` ("0.5b" or "1.5b") is kept: beside the tokenizer's source file."""
    if shape not in SHAPES:
        raise ValueError(f"shape={shape!r} is unknown: use one of {', '.join(SHAPES)}")
    return Path(source).parent / f"qwen2.5-{shape}-shape.Q4_1.gguf"


def shaped_gguf(shape: str, source: str | Path, log=print) -> Path:
    """The file of `shape`, written on first use (a minute or two for 1.5B, in numpy); `source` is the GGUF file
    whose tokenizer it takes (SmolLM2-135M-Instruct's, bench.llamacpp.DEFAULT_GGUF)."""
    path = shaped_gguf_path(shape, source)
    if not path.is_file():
        if not Path(source).is_file():
            raise FileNotFoundError(f"{source} does not exist: `make models` fetches it (its tokenizer is needed)")
        log(f"writing {path.name}: Qwen2.5-{shape.upper()}'s shape, random weights, SmolLM2's tokenizer (once)")
        write_shaped_gguf(SHAPES[shape], path, source)
    return path


@functools.lru_cache(maxsize=2)
def _tokenizer_fields(source: Path) -> dict:
    """The source file's `tokenizer.*` metadata: name -> (value, its GGUF value types), the types as stored, so
    llama.cpp reads each key with the type it expects (token ids are uint32, not Python's int32)."""
    from gguf import GGUFReader

    fields = GGUFReader(source).fields
    return {name: (f.contents(), f.types) for name, f in fields.items() if name.startswith("tokenizer.")}


def write_shaped_gguf(shape: dict, path: str | Path, source: str | Path, seed: int = 0) -> Path:
    """Write a `qwen2` GGUF of `shape` (random_model's dict: hidden_size, num_hidden_layers, ...) to `path`, written
    to a temporary name first so an interrupted write leaves no file behind."""
    from gguf import GGMLQuantizationType as Q
    from gguf import GGUFWriter, LlamaFileType
    from gguf.quants import quantize

    tok = dict(_tokenizer_fields(Path(source)))  # a copy: the tokens are padded below
    vocab, hidden, ffn = shape["vocab_size"], shape["hidden_size"], shape["intermediate_size"]
    heads, kv_heads = shape["num_attention_heads"], shape["num_key_value_heads"]
    head_dim, (tokens, token_types) = hidden // heads, tok["tokenizer.ggml.tokens"]
    if vocab < len(tokens):
        raise ValueError(f"vocab_size={vocab} is smaller than the tokenizer's {len(tokens)} tokens")
    padding = vocab - len(tokens)
    tok["tokenizer.ggml.tokens"] = tokens + [f"<|unused_{i}|>" for i in range(padding)], token_types
    types, kinds = tok["tokenizer.ggml.token_type"]
    tok["tokenizer.ggml.token_type"] = list(types) + [UNUSED] * padding, kinds

    path, rng = Path(path), np.random.default_rng(seed)
    partial = path.with_name(path.name + ".partial")
    w = GGUFWriter(partial, ARCH)
    w.add_name(f"random {path.stem}")
    w.add_file_type(LlamaFileType.MOSTLY_Q4_1)
    w.add_block_count(shape["num_hidden_layers"])
    w.add_context_length(shape["max_position_embeddings"])
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(shape["rope_theta"])
    w.add_layer_norm_rms_eps(shape["rms_norm_eps"])
    for name, (value, kinds) in tok.items():
        w.add_key_value(name, value, kinds[0], sub_type=kinds[-1] if len(kinds) > 1 else None)

    def matrix(name: str, rows: int, cols: int, kind=Q.Q4_1):
        data = rng.normal(0.0, 0.02, size=(rows, cols)).astype(np.float32)
        w.add_tensor(name, quantize(data, kind), raw_dtype=kind)

    def vector(name: str, n: int, value: float):
        w.add_tensor(name, np.full(n, value, dtype=np.float32))

    matrix("token_embd.weight", vocab, hidden, Q.Q8_0)
    for i in range(shape["num_hidden_layers"]):
        b = f"blk.{i}."
        vector(b + "attn_norm.weight", hidden, 1.0)
        for part, rows in (("attn_q", heads * head_dim), ("attn_k", kv_heads * head_dim), ("attn_v", kv_heads * head_dim)):
            matrix(b + part + ".weight", rows, hidden)
            vector(b + part + ".bias", rows, 0.0)
        matrix(b + "attn_output.weight", hidden, heads * head_dim)
        vector(b + "ffn_norm.weight", hidden, 1.0)
        matrix(b + "ffn_gate.weight", ffn, hidden)
        matrix(b + "ffn_up.weight", ffn, hidden)
        matrix(b + "ffn_down.weight", hidden, ffn)
    vector("output_norm.weight", hidden, 1.0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    partial.rename(path)
    return path

