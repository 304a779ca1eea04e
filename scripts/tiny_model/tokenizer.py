"""Train and save the byte-level BPE tokenizer.

Byte-level BPE (GPT-2 / Qwen style) from the `tokenizers` library: ByteLevel pre-tokenizer with
no added prefix space and the ByteLevel decoder, so decode(encode(text)) == text for any text.
Special tokens come first: <|endoftext|>=0, <|im_start|>=1, <|im_end|>=2.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# Exactly the Qwen2.5 ChatML layout, without Qwen's default system prompt or tool blocks.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def save_tokenizer(tok: Tokenizer, out: Path, model_max_length: int) -> None:
    tok.save(str(out / "tokenizer.json"))
    added = {str(tok.token_to_id(t)): {"content": t, "lstrip": False, "normalized": False,
                                       "rstrip": False, "single_word": False, "special": True}
             for t in SPECIAL}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
        "split_special_tokens": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
