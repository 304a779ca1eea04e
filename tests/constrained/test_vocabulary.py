"""TokenVocabulary: token ids -> bytes, for byte-level BPE and SentencePiece-style tokenizers.

Also home of `byte_bpe_tokenizer()`, the small byte-level BPE tokenizer the other
test_constrained_* modules share, trained here so no test depends on a shipped model.
"""
from __future__ import annotations

import functools
import json
import random

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from nano_infer.text.byte_level import gpt2_byte_to_unicode
from nano_infer.constrained import TokenVocabulary

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
EOS = "<|endoftext|>"


def training_text(seed: int = 0) -> list[str]:
    """A few KB mixing JSON, numbers, English, Chinese and emoji, so merges cross all of them."""
    rng = random.Random(seed)
    words = ["name", "age", "city", "tags", "score", "true", "false", "null", "hello", "world",
             "北京", "上海", "你好", "世界", "数据", "模型", "🙂", "🚀", "😀👍", "café", "naïve"]
    texts = []
    for _ in range(150):
        record = {rng.choice(words): rng.choice([rng.randint(-999, 99999), round(rng.uniform(-9, 9), 3),
                                                  " ".join(rng.choices(words, k=3)), rng.random() < 0.5, None])
                  for _ in range(rng.randint(1, 4))}
        texts.append(json.dumps(record, ensure_ascii=False))
        texts.append(" ".join(rng.choices(words, k=8)) + f" {rng.randint(0, 10**6)}.")
    return texts


@functools.lru_cache(maxsize=None)
def byte_bpe_tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, min_frequency=2, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(training_text(), trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS,
                                   additional_special_tokens=SPECIAL[1:])


def byte_bpe_vocabulary(vocab_size: int | None = None) -> TokenVocabulary:
    tok = byte_bpe_tokenizer()
    return TokenVocabulary.from_tokenizer(tok, vocab_size=vocab_size, eos_token_ids={tok.eos_token_id})


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
