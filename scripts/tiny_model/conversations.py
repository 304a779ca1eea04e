"""Scenes -> ChatML conversations -> token ids with assistant-only labels.

For a scene and one character C who speaks in it, the conversation is:
  system:    "You are C in <play>. Stay in character and answer in Shakespeare's words."
  user:      the other speakers' lines since C last spoke, each as "NAME: text"
  assistant: C's speech (the words only)
  ... alternating, starting with a user turn and ending with an assistant turn.
A long scene is cut into several conversations so each fits in `max_tokens` tokens.
Loss is taken only on assistant tokens: the words of the reply and its closing <|im_end|>
(not the "<|im_start|>assistant\\n" header, not the newline after <|im_end|>).
"""
from __future__ import annotations

import random

from .corpus import Play

GROUP = {"ALL", "BOTH", "OMNES", "SEVERAL", "LORDS", "CITIZENS", "SOLDIERS"}


def system_prompt(character: str, title: str) -> str:
    return f"You are {character} in {title}. Stay in character and answer in Shakespeare's words."


def render(messages: list[dict]) -> tuple[str, list[tuple[int, int]]]:
    """The ChatML string (identical to the chat template) and the char spans that get loss."""
    parts, spans, pos = [], [], 0
    for m in messages:
        head = f"<|im_start|>{m['role']}\n"
        body = m["content"] + "<|im_end|>"
        if m["role"] == "assistant":
            spans.append((pos + len(head), pos + len(head) + len(body)))
        piece = head + body + "\n"
        parts.append(piece)
        pos += len(piece)
    return "".join(parts), spans


def encode(tok, messages: list[dict]) -> tuple[list[int], list[int]]:
    """Token ids and a 0/1 loss mask (1 on assistant content tokens and their <|im_end|>)."""
    text, spans = render(messages)
    enc = tok.encode(text, add_special_tokens=False)
    return list(enc.ids), mask_from_offsets(enc.offsets, spans)


def mask_from_offsets(offsets, spans) -> list[int]:
    mask, j = [], 0
    for start, _end in offsets:
        while j < len(spans) and start >= spans[j][1]:
            j += 1
        mask.append(int(j < len(spans) and spans[j][0] <= start < spans[j][1]))
    return mask


def _trim(text: str, n_tok, limit: int, keep_end: bool) -> str:
    """Cut a speech at line boundaries to at most ~`limit` tokens (keep its end or its start)."""
    lines = text.split("\n")
    sizes = [n_tok(l) + 1 for l in lines]
    total = sum(sizes)
    while len(lines) > 1 and total > limit:
        total -= sizes.pop(0 if keep_end else -1)
        lines.pop(0 if keep_end else -1)
    return "\n".join(lines)


def _size(text: str, n_tok) -> int:
    """Approximate token count: the sum over lines (BPE never merges across a newline much)."""
    return sum(n_tok(l) + 1 for l in text.split("\n"))


def scene_conversations(play: Play, scene, character: str, n_tok, max_tokens: int) -> list[list[dict]]:
    turns: list[list] = []        # [role, content]
    for speaker, text in scene:
        role = "assistant" if speaker == character else "user"
        content = text if role == "assistant" else f"{speaker}: {text}"
        if turns and turns[-1][0] == role:
            turns[-1][1] += "\n" + content
        else:
            turns.append([role, content])
    while turns and turns[0][0] == "assistant":
        turns.pop(0)
    if turns and turns[-1][0] == "user":
        turns.pop()
    system = {"role": "system", "content": system_prompt(character, play.title)}
    budget = max_tokens - n_tok(system["content"]) - 8
    convs, cur, used = [], [], 0
    for i in range(0, len(turns) - 1, 2):
        user = _trim(turns[i][1], n_tok, budget // 3, keep_end=True)
        reply = _trim(turns[i + 1][1], n_tok, budget - _size(user, n_tok) - 12, keep_end=False)
        cost = _size(user, n_tok) + _size(reply, n_tok) + 12
        if cur and used + cost > budget:
            convs.append([system] + cur)
            cur, used = [], 0
        if cost > budget:
            continue
        cur += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
        used += cost
    if cur:
        convs.append([system] + cur)
    return convs


def build_conversations(plays: list[Play], n_tok, max_tokens: int, min_speeches: int = 2) -> list[list[dict]]:
    out = []
    for play in plays:
        for scene in play.scenes:
            counts: dict[str, int] = {}
            for speaker, _ in scene:
                counts[speaker] = counts.get(speaker, 0) + 1
            for character in sorted(c for c, n in counts.items() if n >= min_speeches and c not in GROUP):
                out += scene_conversations(play, scene, character, n_tok, max_tokens)
    return out


def tokenizer_corpus(plays: list[Play]):
    """Text the tokenizer is trained on: every speech once, as 'NAME: text', plus system prompts."""
    for play in plays:
        names = set()
        for scene in play.scenes:
            for speaker, text in scene:
                names.add(speaker)
                yield f"{speaker}: {text}\n"
        for name in sorted(names):
            yield system_prompt(name, play.title) + "\n"


def pack(examples: list[tuple[list[int], list[int]]], seq_len: int, pad_id: int, seed: int):
    """Shuffle whole conversations and pack them first-fit into rows of seq_len; pad the rest."""
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    rows, cur_ids, cur_mask = [], [], []
    for i in order:
        ids, mask = examples[i]
        if cur_ids and len(cur_ids) + len(ids) > seq_len:
            rows.append((cur_ids + [pad_id] * (seq_len - len(cur_ids)), cur_mask + [0] * (seq_len - len(cur_mask))))
            cur_ids, cur_mask = [], []
        cur_ids, cur_mask = cur_ids + ids[:seq_len], cur_mask + mask[:seq_len]
    if cur_ids:
        rows.append((cur_ids + [pad_id] * (seq_len - len(cur_ids)), cur_mask + [0] * (seq_len - len(cur_mask))))
    return rows
