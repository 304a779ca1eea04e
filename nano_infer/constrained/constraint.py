"""One request's constraint: a position in a token index, moved by each sampled token."""
from __future__ import annotations

import json
from collections.abc import Hashable
from dataclasses import dataclass, replace

import torch

from .backends import ToLibrary, Unsupported, backend_for
from .byte_dfa import ByteDFA
from .dfa_cost import DFA_BUDGET, dfa_cost
from .json_schema import escape, json_schema_to_regex, load_schema
from .limits import ConstraintLimits
from .schema_size import schema_regex_chars
from .token_index import TokenIndex
from .vocabulary import TokenVocabulary

DEFAULT_LIMITS = ConstraintLimits()


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

    def allows(self, token_id: int) -> bool:
        """Whether `token_id` may come next (speculative decoding cuts proposals at the first that may not)."""
        return self.index.next_state(self.state, int(token_id)) >= 0

    @property
    def is_accepting(self) -> bool:
        return bool(self.index.accepting[self.state])

    @property
    def is_done(self) -> bool:
        return self.is_accepting and len(self.index.allowed(self.state)) == 0

    def fork(self) -> "Constraint":
        """An independent copy at the same state; the index (and its mask rows) is shared."""
        return replace(self)


def build_constraint(params, vocab: TokenVocabulary, device="cpu", limits: ConstraintLimits = DEFAULT_LIMITS,
                     index=None, backend: str = "auto"):
    """The constraint `params` asks for (regex, json_schema, choice, grammar, structural_tag), or None if none.

    `index` is the token index (or llguidance's GrammarIndex) when the caller compiled it already
    (AsyncLLM does, off the engine thread); `backend` picks who compiles it otherwise (backends.py).
    Raises ValueError, saying why, for a regex that matches nothing or cannot be compiled, a malformed
    schema or grammar, a constraint over `limits`, or (backend "nano") one the DFA does not express.
    """
    if index is None:
        key = constraint_key(params)
        if key is None:
            return None
        index = compile_any(key, vocab, limits, backend)
    if not isinstance(index, TokenIndex):
        from .grammar_backend import grammar_constraint  # llguidance is imported by the first request that uses it
        return grammar_constraint(index, device)
    return Constraint(index, torch.device(device), index.initial)


def compile_any(key: tuple[str, str], vocab: TokenVocabulary, limits: ConstraintLimits = DEFAULT_LIMITS,
                backend: str = "auto", owner: Hashable = None):
    """The compiled form of `key` by the backend it goes to: a TokenIndex (cached) or a GrammarIndex."""
    if backend_for(key[0], backend) == "nano":
        index = token_index(key, vocab, limits, owner, auto=backend == "auto")
        if isinstance(index, TokenIndex):
            return index
    from .grammar_backend import GrammarIndex
    return GrammarIndex.compile(key, vocab, limits)


def constraint_key(params) -> tuple[str, str] | None:
    """The constraint as (kind, canonical text): equal keys compile to the same index, whatever
    the spacing of the schema the client sent. Key order is kept: properties are generated in
    schema order, so two orders are two constraints."""
    if params.regex is not None:
        return ("regex", params.regex)
    if params.json_schema is not None:
        schema = load_schema(params.json_schema)
        try:
            return ("json_schema", json.dumps(schema, ensure_ascii=False, separators=(",", ":")))
        except (TypeError, ValueError) as e:
            raise ValueError(f"json_schema is not a JSON document: {e}") from e
    if params.choice is not None:
        return ("choice", json.dumps(list(params.choice), ensure_ascii=False))
    for kind in ("grammar", "structural_tag"):
        text = getattr(params, kind, None)
        if text is not None:
            return (kind, text if isinstance(text, str) else json.dumps(text, ensure_ascii=False))
    return None


def check_key(key: tuple[str, str], limits: ConstraintLimits = DEFAULT_LIMITS) -> None:
    """The limits a constraint key can be held to before any of it is compiled: its text's size and
    nesting, the length of a schema's regex (computed, not written) and its repetition counts. Cheap enough for
    an event loop."""
    kind, text = key
    limits.check_spec(kind.replace("_", " "), text)
    if kind in ("grammar", "structural_tag"):
        from .grammar_backend import check_grammar
        check_grammar(kind, text)
    elif kind == "json_schema":
        schema_regex_chars(json.loads(text), limits)
    elif kind == "regex":
        limits.check_regex(text)


def key_regex(key: tuple[str, str], limits: ConstraintLimits = DEFAULT_LIMITS) -> str:
    """The regex of a constraint key, within `limits`."""
    check_key(key, limits)
    kind, text = key
    if kind == "regex":
        pattern = text
    elif kind == "json_schema":
        pattern = json_schema_to_regex(json.loads(text))
    else:
        pattern = "(" + "|".join(escape(c) for c in json.loads(text)) + ")"
    limits.check_regex(pattern)
    return pattern


def compile_index(key: tuple[str, str], vocab: TokenVocabulary, limits: ConstraintLimits = DEFAULT_LIMITS,
                  auto: bool = False) -> TokenIndex | ToLibrary:
    """key -> regex -> byte DFA -> token index, refusing anything over `limits` on the way.

    With `auto` (backends.py), ToLibrary instead for a constraint the DFA does not express (Unsupported) or
    whose estimated cost is past DFA_BUDGET: decided before the DFA is built, the limits checked first."""
    if auto:
        check_key(key, limits)
        cost = dfa_cost(key, vocab.vocab_size, limits)
        if cost > DFA_BUDGET:
            return ToLibrary(f"its DFA would cost about {cost:,} states (dfa_cost.DFA_BUDGET is {DFA_BUDGET})")
    try:
        dfa = ByteDFA.from_regex(key_regex(key, limits), max_states=limits.max_dfa_states)
    except Unsupported as e:
        if not auto:
            raise
        return ToLibrary(str(e))
    return TokenIndex.build(dfa, vocab)


def token_index(key: tuple[str, str], vocab: TokenVocabulary, limits: ConstraintLimits = DEFAULT_LIMITS,
                owner: Hashable = None, auto: bool = False) -> TokenIndex | ToLibrary:
    """The token index of a constraint key over `vocab`, from the vocabulary's cache if `owner` may use one
    kept there (index_cache: its own, or the operator's); with `auto`, ToLibrary for one the DFA should not take.

    Thread-safe: the engine thread and other threads may ask at once. The build itself
    (seconds for a big schema) runs outside the cache's lock; two threads building the same key at
    once both finish and one result is kept.
    """
    cached = vocab.index_cache.get(owner, key)
    if cached is not None:
        return cached
    index = compile_index(key, vocab, limits, auto)
    return cache_index(key, vocab, index, owner, limits) if isinstance(index, TokenIndex) else index


def cache_index(key, vocab: TokenVocabulary, index: TokenIndex, owner: Hashable = None,
                limits: ConstraintLimits = DEFAULT_LIMITS) -> TokenIndex:
    """Keep `index` for `owner` within limits.cache_bytes; returns the index to use for `key`."""
    return vocab.index_cache.put(owner, key, index, limits.cache_bytes)
