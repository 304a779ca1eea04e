"""One request's constraint: a position in a token index, moved by each sampled token."""
from __future__ import annotations

import threading
from dataclasses import dataclass, replace

import torch

from .byte_dfa import ByteDFA
from .json_schema import escape, json_schema_to_regex
from .token_index import TokenIndex
from .vocabulary import TokenVocabulary

INDEX_CACHE_SIZE = 8  # token indexes kept per vocabulary (with their mask rows), least recently used dropped first
_CACHE_LOCK = threading.Lock()


@dataclass(eq=False)
class Constraint:
    """The engine's view of a constrained request.

    Each step: add `mask()` to the request's logits row, sample, then `advance(token)`.
    `is_done` means only EOS may follow, so the engine can finish the request right away.
    """

    index: TokenIndex
    device: torch.device
    state: int

    def mask(self) -> torch.Tensor:
        return self.index.mask_row(self.state, self.device)

    def advance(self, token_id: int) -> None:
        nxt = self.index.next_state(self.state, int(token_id))
        if nxt < 0:
            raise ValueError(f"token {token_id} is not allowed by the constraint in state {self.state}")
        self.state = nxt

    @property
    def is_accepting(self) -> bool:
        return bool(self.index.accepting[self.state])

    @property
    def is_done(self) -> bool:
        return self.is_accepting and len(self.index.allowed(self.state)) == 0

    def fork(self) -> "Constraint":
        """An independent copy at the same state; the index (and its mask rows) is shared."""
        return replace(self)


def build_constraint(params, vocab: TokenVocabulary, device="cpu") -> Constraint | None:
    """The constraint `params` asks for (regex, json_schema or choice), or None if none.

    Raises ValueError, saying why, for a regex that matches nothing or cannot be compiled, a
    malformed schema, or a schema keyword this module does not support.
    """
    pattern = constraint_regex(params)
    if pattern is None:
        return None
    index = token_index(pattern, vocab)
    return Constraint(index, torch.device(device), index.initial)


def constraint_regex(params) -> str | None:
    if params.regex is not None:
        return params.regex
    if params.json_schema is not None:
        return json_schema_to_regex(params.json_schema)
    if params.choice is not None:
        return "(" + "|".join(escape(c) for c in params.choice) + ")"
    return None


def token_index(pattern: str, vocab: TokenVocabulary) -> TokenIndex:
    """The token index of `pattern` over `vocab`, from the vocabulary's LRU cache if there.

    Thread-safe: AsyncLLM builds indexes on worker threads while the engine thread reads the
    cache. The build itself (seconds for a big schema) runs outside the lock; two threads
    building the same pattern at once both finish and one result is kept.
    """
    cache = vocab.index_cache
    with _CACHE_LOCK:
        if pattern in cache:
            cache.move_to_end(pattern)
            return cache[pattern]
    index = TokenIndex.build(ByteDFA.from_regex(pattern), vocab)
    with _CACHE_LOCK:
        index = cache.setdefault(pattern, index)
        cache.move_to_end(pattern)
        if len(cache) > INDEX_CACHE_SIZE:
            cache.popitem(last=False)
    return index
