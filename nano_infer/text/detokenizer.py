"""Incremental detokenization: text deltas that never split a UTF-8 character.

Byte-level BPE tokens are byte strings, and one character (a Chinese ideograph, an emoji)
may be cut across two tokens. Decoding each token alone would print replacement
characters. Instead we keep the bytes and feed them to an incremental UTF-8 decoder,
which holds back an incomplete character until its last byte arrives. The deltas
therefore concatenate to exactly `tokenizer.decode(all_ids)`.

Tokenizers that are not byte-level (SentencePiece) fall back to re-decoding a short
window of recent tokens and emitting only the stable new suffix.
"""
from __future__ import annotations

import codecs
import functools
from typing import TYPE_CHECKING

from .byte_level import gpt2_unicode_to_byte, is_byte_level

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


_TABLES: dict[int, tuple[PreTrainedTokenizerBase, list[bytes], set[int]]] = {}


def token_bytes_table(tokenizer) -> tuple[list[bytes], set[int]]:
    """bytes of every token id of a byte-level BPE tokenizer, and the ids of special tokens."""
    key = id(tokenizer)
    if key not in _TABLES or _TABLES[key][0] is not tokenizer:
        dec = gpt2_unicode_to_byte()
        vocab = tokenizer.get_vocab()
        added = {t.content for t in tokenizer.backend_tokenizer.get_added_tokens_decoder().values() if t.special}
        table = [b""] * (max(vocab.values()) + 1)
        special = set()
        for token, i in vocab.items():
            if token in added:
                table[i], _ = token.encode("utf-8"), special.add(i)
            else:
                table[i] = bytes(dec[c] for c in token) if all(c in dec for c in token) else token.encode("utf-8")
        _TABLES[key] = (tokenizer, table, special)
    return _TABLES[key][1], _TABLES[key][2]


class IncrementalDetokenizer:
    def __init__(self, tokenizer, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.text = ""
        self.token_ids: list[int] = []
        self.byte_level = is_byte_level(tokenizer)
        if self.byte_level:
            self.table, self.special = token_bytes_table(tokenizer)
            self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.prefix_offset = self.read_offset = 0

    def add(self, token_id: int) -> str:
        """Feed one token; returns the text that became final (possibly "")."""
        self.token_ids.append(token_id)
        if self.byte_level:
            if token_id >= len(self.table) or (self.skip_special_tokens and token_id in self.special):
                return ""
            delta = self.decoder.decode(self.table[token_id])
        else:
            delta = self._add_by_window()
        self.text += delta
        return delta

    def _add_by_window(self) -> str:
        decode = functools.partial(self.tokenizer.decode, skip_special_tokens=self.skip_special_tokens)
        prefix = decode(self.token_ids[self.prefix_offset : self.read_offset])
        full = decode(self.token_ids[self.prefix_offset :])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self.prefix_offset, self.read_offset = self.read_offset, len(self.token_ids)
            return full[len(prefix) :]
        return ""

    def flush(self) -> str:
        """At the end of the sequence: whatever is still held back (an incomplete character)."""
        if self.byte_level:
            delta = self.decoder.decode(b"", final=True)
        else:
            decode = functools.partial(self.tokenizer.decode, skip_special_tokens=self.skip_special_tokens)
            full = decode(self.token_ids[self.prefix_offset :])
            delta = full[len(decode(self.token_ids[self.prefix_offset : self.read_offset])) :]
            self.prefix_offset = self.read_offset = len(self.token_ids)
        self.text += delta
        return delta
