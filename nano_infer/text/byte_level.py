"""GPT-2's byte-level BPE alphabet, and telling which tokenizers write their tokens in it.

Byte-level BPE (GPT-2, Llama 3, Qwen) stores every token as a string over 256 printable
stand-ins, one per byte value. The detokenizer (streamed text) and the constrained-decoding
vocabulary (token masks) both turn those strings back into bytes: the table and the look at
the tokenizer's decoder live here once, for both.
"""
from __future__ import annotations

import functools
import json


@functools.cache
def gpt2_byte_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in character for each byte (shared: do not modify).

    Printable Latin-1 bytes stand for themselves; the other 68 bytes (controls, space, ...)
    are moved to U+0100 and up, in byte order.
    """
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


@functools.cache
def gpt2_unicode_to_byte() -> dict[str, int]:
    """The byte each stand-in character stands for: `gpt2_byte_to_unicode` reversed (shared: do not modify)."""
    return {ch: b for b, ch in gpt2_byte_to_unicode().items()}


def decoder_kinds(tokenizer) -> list[str]:
    """The types of a Hugging Face fast tokenizer's decoder steps: ["ByteLevel"] for byte-level BPE,
    e.g. ["Replace", "ByteFallback", "Fuse"] for SentencePiece-style; [] without a decoder."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decoder = backend.decoder if backend is not None else None
    spec = json.loads(decoder.__getstate__()) if decoder is not None else {}
    return [d["type"] for d in spec.get("decoders", [spec] if spec else [])]


def is_byte_level(tokenizer) -> bool:
    """The decoder is ByteLevel and nothing else, so `decode(ids)` is exactly the tokens' bytes, joined, as UTF-8.

    Stricter than "ByteLevel is among the decoder steps": another step (a strip, a replace)
    would make decoded text differ from the bytes, which streaming relies on.
    """
    return decoder_kinds(tokenizer) == ["ByteLevel"]
