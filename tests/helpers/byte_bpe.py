"""A small byte-level BPE tokenizer for the constrained-decoding tests, trained here so no test depends on a shipped model."""
from __future__ import annotations

import functools
import json
import random

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

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
