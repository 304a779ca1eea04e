"""Constraints through llguidance: context-free grammars (GBNF or Lark), structural tags, and JSON Schema,
regex and choice that "auto" does not keep on the DFA (backends.py), or all of them with
`structured_outputs_config={"backend": "guidance"}`.

Chapter 07's byte DFA precomputes a mask row per state, which a grammar cannot have: a context-free
language has unboundedly many parser states. llguidance keeps an Earley parser over a lexer and computes
each step's mask from the parser's state, so nothing is compiled ahead: building a matcher only parses the
grammar, and the cost moves to every decoding step. The object the engine holds has the same shape as
a DFA `Constraint` (mask, advance, allows, is_accepting, is_done, fork), so sampling, n > 1 samples and
speculative decoding treat both alike.

The library's own limits (LLParserLimits: grammar size, lexer states, work per step) bound what a
client's grammar can cost, so a grammar is checked on the thread that asks, with no worker process.
"""
from __future__ import annotations

import json
import weakref
from dataclasses import dataclass

import llguidance
import numpy as np
import torch
from llguidance.gbnf_to_lark import any_to_lark

from .json_schema import escape
from .limits import ConstraintLimits
from .vocabulary import TokenVocabulary

TEXT = r"/(.|\n)*/"  # free text around a structural tag's structures
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}  # json.dumps', as the DFA's
# the 8 mask entries each byte of llguidance's bitmask stands for (bit i: token 8k + i): one gather per step
_BYTE_ROWS = np.where(np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1, bitorder="little"),
                      np.float32(0), np.float32("-inf"))
_TOKENIZERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # TokenVocabulary -> LLTokenizer


def grammar_text(kind: str, text: str, limits: ConstraintLimits = ConstraintLimits()) -> str:
    """llguidance's grammar for a constraint key; ValueError naming `kind` if it is not one."""
    limits.check_spec(kind.replace("_", " "), text)
    try:
        if kind == "grammar":
            lark = lark_of(text)
        elif kind == "structural_tag":
            lark = structural_tag_lark(json.loads(text))
        elif kind == "json_schema":
            return llguidance.LLMatcher.grammar_from_json_schema(closed(json.loads(text)), defaults=JSON_LAYOUT)
        elif kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(text)
        else:
            return llguidance.LLMatcher.grammar_from_regex("(" + "|".join(escape(c) for c in json.loads(text)) + ")")
        return llguidance.LLMatcher.grammar_from_lark(lark)
    except (ValueError, TypeError, KeyError) as e:
        raise ValueError(f"{kind} is not valid: {e}") from None


def closed(schema):
    """The schema with `additionalProperties: false` wherever an object lists its properties and says nothing
    of others: what the DFA path does (it writes only listed properties), and vLLM's
    disable_additional_properties. A model that may invent keys wanders off the schema's intent."""
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: closed(v) for k, v in schema.items()}
    if isinstance(schema.get("properties"), dict) and "additionalProperties" not in schema:
        out["additionalProperties"] = False
    return out


def lark_of(text: str) -> str:
    """Lark as it is; GBNF (llama.cpp's `root ::= ...`, vLLM's grammar field) converted to Lark."""
    try:
        return any_to_lark(text)
    except Exception as e:  # the converter raises its own error class for a malformed GBNF
        raise ValueError(f"GBNF does not parse: {e}") from None


def structural_tag_lark(tag: dict) -> str:
    """vLLM's structural tag, `{"structures": [{"begin", "schema", "end"}], "triggers": [...]}`: free text in
    which each structure starts where one of its triggers appears, then holds a JSON value of its schema."""
    if not isinstance(tag, dict) or not tag.get("structures") or not tag.get("triggers"):
        raise ValueError("a structural tag needs non-empty 'structures' and 'triggers' lists")
    rules, names = [], []
    for i, s in enumerate(tag["structures"]):
        begin, end = s["begin"], s.get("end", "")
        trigger = next((t for t in tag["triggers"] if t and begin.startswith(t)), None)
        if trigger is None:
            raise ValueError(f"structures[{i}].begin {begin!r} starts with none of the triggers")
        rest = json.dumps(begin[len(trigger):]) if len(begin) > len(trigger) else ""
        rules.append(f"tag{i}_start[lazy]: TEXT {json.dumps(trigger)}")
        rules.append(f"tag{i}: tag{i}_start {rest} %json {json.dumps(closed(s.get('schema', {})))} "
                     f"{json.dumps(end) if end else ''}")
        names.append(f"tag{i}")
    return "\n".join([f"start: ({' | '.join(names)})* TEXT", f"TEXT: {TEXT}", *rules]) + "\n"


def check_grammar(kind: str, text: str) -> None:
    """Whether llguidance takes the grammar, without a vocabulary: cheap enough for a request's validation."""
    error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar_text(kind, text))
    if error:
        raise ValueError(f"{kind} is not valid: {messages[0].strip()}")


def ll_tokenizer(vocab: TokenVocabulary):
    """llguidance's view of the vocabulary, made once per vocabulary (a large one takes a fraction of a second).
    Ids that spell nothing (padding rows) are empty and never allowed."""
    tok = _TOKENIZERS.get(vocab)
    if tok is None:
        eos = sorted(vocab.eos_token_ids)
        wrapper = _Wrapper([b or b"" for b in vocab.token_bytes], eos)
        tok = _TOKENIZERS[vocab] = llguidance.LLTokenizer(llguidance.TokenizerWrapper(wrapper), eos_token=eos)
    return tok


class _Wrapper:
    """What llguidance.TokenizerWrapper reads: the tokens' bytes, EOS, and a tokenizer. The library tokenizes
    the text a grammar forces (to know which tokens can spell it); longest match over the vocabulary is a
    valid spelling of any text the vocabulary covers, which is all it needs."""

    bos_token_id = None

    def __init__(self, tokens: list[bytes], eos: list[int]):
        self.tokens, self.special_token_ids, self.eos_token_id = tokens, eos, eos[0]
        self._ids = {b: i for i, b in reversed(list(enumerate(tokens))) if b and i not in eos}
        self._longest = max(map(len, self._ids), default=1)

    def __call__(self, text: bytes | str) -> list[int]:
        data = text.encode() if isinstance(text, str) else text
        out, at = [], 0
        while at < len(data):
            n = next((n for n in range(min(self._longest, len(data) - at), 0, -1) if data[at:at + n] in self._ids), 0)
            if n == 0:
                return out  # a byte no token spells: nothing more can be said about the rest
            out.append(self._ids[data[at:at + n]])
            at += n
        return out


@dataclass(eq=False)
class GrammarIndex:
    """A checked grammar over one vocabulary: what the DFA path's TokenIndex is, for llguidance."""

    kind: str
    grammar: str
    tokenizer: llguidance.LLTokenizer
    vocab_size: int

    @classmethod
    def compile(cls, key: tuple[str, str], vocab: TokenVocabulary, limits: ConstraintLimits = ConstraintLimits()):
        kind, text = key
        index = cls(kind, grammar_text(kind, text, limits), ll_tokenizer(vocab), vocab.vocab_size)
        index.matcher()  # refuses a grammar the library cannot build, naming the field
        return index

    def matcher(self):
        m = llguidance.LLMatcher(self.tokenizer, self.grammar, log_level=0)
        if m.is_error():
            raise ValueError(f"{self.kind} is not valid: {m.get_error().strip()}")
        return m


@dataclass(eq=False)
class GrammarConstraint:
    """A Constraint (constraint.py) whose state is an llguidance matcher; each sample holds its own (fork)."""

    index: GrammarIndex
    device: torch.device
    matcher: llguidance.LLMatcher

    def mask(self) -> torch.Tensor:
        """0 where the next token is allowed, -inf elsewhere: a row to add to the logits."""
        packed = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        return torch.from_numpy(_BYTE_ROWS[packed].reshape(-1)[: self.index.vocab_size]).to(self.device)

    def allows(self, token_id: int) -> bool:
        return self.matcher.validate_tokens([int(token_id)]) == 1

    def advance(self, token_id: int) -> None:
        if not self.matcher.consume_token(int(token_id)):
            raise ValueError(f"token {token_id} is not allowed by the {self.index.kind} constraint")

    @property
    def is_accepting(self) -> bool:
        return self.matcher.is_accepting()

    @property
    def is_done(self) -> bool:
        """Only EOS may follow (the grammar has no continuation), or EOS was taken."""
        return self.matcher.is_stopped()

    def fork(self) -> "GrammarConstraint":
        return GrammarConstraint(self.index, self.device, self.matcher.deep_copy())


def grammar_constraint(index: GrammarIndex, device="cpu") -> GrammarConstraint:
    return GrammarConstraint(index, torch.device(device), index.matcher())
