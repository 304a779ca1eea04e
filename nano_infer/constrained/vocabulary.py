"""What every token id spells, in bytes.

A constraint is a language over bytes, so the mask needs each token's exact bytes. Tokenizers
store tokens as strings in their own alphabets: byte-level BPE (GPT-2, Llama 3, Qwen) maps every
byte to a printable character; SentencePiece-style vocabularies write a space as "▁" and bytes
that have no piece of their own as "<0xNN>". Special and added tokens (EOS, "<|im_start|>", tool
tags) are control signals, not text: they never match a pattern, and EOS is handled apart.
"""
from __future__ import annotations

import base64
import re
import weakref
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from ..text.byte_level import decoder_kinds, gpt2_unicode_to_byte
from .index_cache import IndexCache
from .trie import VocabTrie


@dataclass(eq=False)
class TokenVocabulary:
    """`token_bytes[i]` is what token i spells, or None if it never matches text.

    The list is as long as the model's vocabulary (its embedding rows), which can exceed the
    tokenizer's: padded rows have no token and stay None, so they are never allowed.
    """

    token_bytes: list[bytes | None]
    eos_token_ids: frozenset[int]
    # Token indexes built for this vocabulary, per owner (a server's tenant), by constraint key.
    index_cache: IndexCache = field(default_factory=IndexCache, repr=False)

    def __post_init__(self):
        self.eos_token_ids = frozenset(self.eos_token_ids)
        bad = [t for t in self.eos_token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"eos_token_ids {bad} are outside the vocabulary (size {self.vocab_size})")

    @property
    def vocab_size(self) -> int:
        return len(self.token_bytes)

    @cached_property
    def trie(self) -> VocabTrie:
        """Trie of the text tokens; EOS is never text, whatever its bytes."""
        return VocabTrie.build({
            i: b for i, b in enumerate(self.token_bytes) if b and i not in self.eos_token_ids
        })

    @classmethod
    def from_tokenizer(cls, tokenizer, vocab_size: int | None = None,
                       eos_token_ids=None) -> "TokenVocabulary":
        """The vocabulary of a Hugging Face (fast) tokenizer, built once per tokenizer.

        `vocab_size` is the model's (defaults to len(tokenizer)); `eos_token_ids` defaults to
        the tokenizer's EOS. Building reads every token, so results are cached on the tokenizer
        object (held weakly: the cache goes when the tokenizer does).
        """
        vocab_size = len(tokenizer) if vocab_size is None else vocab_size
        if eos_token_ids is None:
            eos_token_ids = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
        key = (vocab_size, frozenset(eos_token_ids))
        per_tokenizer = _CACHE.setdefault(tokenizer, {})
        if key not in per_tokenizer:
            per_tokenizer[key] = cls(_token_bytes(tokenizer, vocab_size), key[1])
        return per_tokenizer[key]

    @classmethod
    def from_tiktoken(cls, path, vocab_size: int | None = None, eos_token_ids=()) -> "TokenVocabulary":
        """The vocabulary in a tiktoken ranks file ("<base64 bytes> <id>" per line).

        Such files (OpenAI's encodings, Qwen's qwen.tiktoken) store every token's bytes
        directly; special tokens are not in them, so their ids stay None.
        """
        ranks = [line.split() for line in Path(path).read_text().splitlines() if line]
        size = max(int(i) for _, i in ranks) + 1
        token_bytes: list[bytes | None] = [None] * max(size, vocab_size or 0)
        for data, i in ranks:
            token_bytes[int(i)] = base64.b64decode(data)
        return cls(token_bytes, frozenset(eos_token_ids))


_CACHE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _token_bytes(tokenizer, vocab_size: int) -> list[bytes | None]:
    to_bytes = _piece_decoder(tokenizer)
    added = set(tokenizer.added_tokens_decoder) | set(tokenizer.all_special_ids)
    out: list[bytes | None] = [None] * vocab_size
    for piece, tid in tokenizer.get_vocab().items():
        if tid < vocab_size and tid not in added:
            out[tid] = to_bytes(piece)
    return out


def _piece_decoder(tokenizer):
    """A function piece -> bytes for the tokenizer's kind of vocabulary."""
    kinds = decoder_kinds(tokenizer)
    if "ByteLevel" in kinds:  # among other steps too: the pieces are still written in the byte alphabet
        to_byte = gpt2_unicode_to_byte()

        def byte_level(piece: str) -> bytes | None:
            try:
                return bytes(to_byte[ch] for ch in piece)
            except KeyError:  # not from the byte alphabet: cannot be text
                return None

        return byte_level
    if "ByteFallback" in kinds or "Metaspace" in kinds:
        def sentencepiece(piece: str) -> bytes:
            m = _BYTE_PIECE.fullmatch(piece)
            return bytes([int(m.group(1), 16)]) if m else piece.replace("\u2581", " ").encode()

        return sentencepiece
    raise ValueError(
        f"constrained decoding needs a byte-level BPE or SentencePiece-style tokenizer; "
        f"this one's decoder is {kinds or 'missing'}"
    )


_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
