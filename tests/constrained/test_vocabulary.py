"""TokenVocabulary: token ids -> bytes, for byte-level BPE and SentencePiece-style tokenizers."""
from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

from nano_infer.text.byte_level import gpt2_byte_to_unicode
from nano_infer.constrained import TokenVocabulary
from tests.helpers.byte_bpe import EOS, SPECIAL, byte_bpe_tokenizer, byte_bpe_vocabulary


def test_byte_level_tokens_decode_to_their_bytes():
    tok = byte_bpe_tokenizer()
    vocab = byte_bpe_vocabulary()
    assert vocab.vocab_size == len(tok)
    for text in ['{"name": "北京 🙂"}', "naïve café 123", "😀👍 你好世界"]:
        ids = tok.encode(text)
        assert b"".join(vocab.token_bytes[i] for i in ids) == text.encode()


def test_special_tokens_and_padding_never_match_text():
    tok = byte_bpe_tokenizer()
    vocab = byte_bpe_vocabulary(vocab_size=len(tok) + 13)  # padded embedding rows, like Qwen's
    for name in SPECIAL:
        assert vocab.token_bytes[tok.convert_tokens_to_ids(name)] is None
    assert vocab.token_bytes[len(tok):] == [None] * 13
    assert vocab.eos_token_ids == {tok.convert_tokens_to_ids(EOS)}


def test_vocabulary_is_cached_per_tokenizer_and_settings():
    tok = byte_bpe_tokenizer()
    assert byte_bpe_vocabulary() is byte_bpe_vocabulary()
    assert byte_bpe_vocabulary(len(tok) + 1) is not byte_bpe_vocabulary()


def test_gpt2_alphabet_is_a_bijection_onto_printable_characters():
    table = gpt2_byte_to_unicode()
    assert sorted(table) == list(range(256)) and len(set(table.values())) == 256
    assert table[ord("A")] == "A" and table[ord(" ")] == "Ġ" and table[ord("\n")] == "Ċ"


def test_sentencepiece_style_pieces_and_byte_fallback():
    vocab = {"<unk>": 0, "</s>": 1, "▁the": 2, "a": 3, "<0x0A>": 4, "<0xE4>": 5, "▁": 6}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", unk_token="<unk>")
    v = TokenVocabulary.from_tokenizer(hf)
    assert v.token_bytes[2:7] == [b" the", b"a", b"\n", b"\xe4", b" "]
    assert v.token_bytes[0] is None and v.token_bytes[1] is None


def test_unknown_tokenizer_kind_is_a_clear_error():
    tok = Tokenizer(models.WordLevel(vocab={"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")
    with pytest.raises(ValueError, match="byte-level BPE or SentencePiece"):
        TokenVocabulary.from_tokenizer(hf)
