"""How big a prompt may be, checked by counting before it is tokenized (a chat: before its template is rendered).

Tokenizing runs on one thread for every client, so a chat too long to fit must be refused
before it takes that thread (a check on characters alone passes 100,000 empty messages, which
render into far more tokens than max_model_len). Each message costs at least the template's tokens around a content (`<|im_start|>user\\n` and
`<|im_end|>\\n`: 5 in ChatML), measured once on empty messages; so many messages that this alone
exceeds max_model_len are refused at once, as are contents longer in characters than
max_model_len tokens can spell.
"""
from __future__ import annotations

import functools

from ..text.chat_template import chat_token_ids
from ..text.utf8 import check_utf8


def check_prompt_size(engine, prompt) -> None:
    """What counting can refuse: a text or chat longer than max_model_len tokens can spell, max_model_len token
    ids or more (2 million of them were counted by the engine thread, ~6 s each)."""
    if isinstance(prompt, str):
        engine.check_prompt_chars(prompt)
    elif not isinstance(prompt, list):
        raise ValueError("prompt must be a string, a list of token ids or a list of chat messages")
    elif not prompt:
        raise ValueError("prompt is empty: it must have at least one token")
    elif isinstance(prompt[0], dict):
        check_chat_size(engine, prompt)
    elif len(prompt) >= engine.max_model_len:
        raise ValueError(f"prompt has {len(prompt)} tokens; the limit is max_model_len - 1 = {engine.max_model_len - 1}")


def check_chat_size(engine, messages: list[dict]) -> None:
    contents = [m["content"] for m in messages if isinstance(m, dict) and isinstance(m.get("content"), str)]
    for content in contents:
        check_utf8(content, "a message")
    at_least = len(messages) * tokens_per_message(engine.tokenizer)
    if at_least > engine.max_model_len:
        raise ValueError(f"messages: {len(messages):,} messages take at least {at_least:,} tokens of chat template, "
                         f"more than max_model_len={engine.max_model_len}")
    chars = sum(map(len, contents))
    if chars > engine.max_prompt_chars:
        raise ValueError(f"messages have {chars:,} characters: more than max_model_len={engine.max_model_len} "
                         f"tokens can hold (at most {engine.max_prompt_chars:,} characters)")


@functools.lru_cache(maxsize=8)
def tokens_per_message(tokenizer) -> int:
    """The fewest tokens the chat template adds per message: three empty turns less one, halved, for
    each role (a template that refuses such a conversation gives no bound for that role)."""
    fewest = None
    for role in ("user", "assistant", "system"):
        try:
            one, three = (len(chat_token_ids(tokenizer, [{"role": role, "content": ""}] * k)) for k in (1, 3))
        except Exception:  # noqa: BLE001 - templates may insist on roles alternating
            continue
        fewest = (three - one) // 2 if fewest is None else min(fewest, (three - one) // 2)
    return fewest or 0
