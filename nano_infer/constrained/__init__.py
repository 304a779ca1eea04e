"""Constrained decoding: regex, JSON Schema and choice constraints as precomputed token masks.

regex -> byte-level DFA (byte_dfa) -> per-state allowed tokens over the vocabulary trie
(token_index) -> a Constraint the engine adds to the logits row of each step. JSON Schema and
choice lists are first written as regexes (json_schema).
"""
from .byte_dfa import ByteDFA
from .constraint import Constraint, build_constraint, constraint_key
from .json_schema import json_schema_to_regex
from .limits import ConstraintLimits
from .token_index import TokenIndex
from .vocabulary import TokenVocabulary

__all__ = ["ByteDFA", "Constraint", "ConstraintLimits", "TokenIndex", "TokenVocabulary", "build_constraint",
           "constraint_key", "json_schema_to_regex"]
