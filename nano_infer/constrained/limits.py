"""How big a constraint may be, checked before any work that grows with it.

A regex is compiled to a DFA whose size can explode: counted repetition `x{1,n}` costs n states
and, in this implementation, time that grows faster than n (on a 2-core CPU `[a-z]{1,500}` takes
~2 s and `[a-z]{1,2000}` ~40 s), and `(a|b)*a(a|b){20}` needs 2^21 states. A server must refuse
such input with a clear message instead of computing for minutes, so every constraint passes
these checks, and a server also bounds the compile's wall time (see `compile_pool`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class ConstraintLimits:
    max_spec_chars: int = 65_536  # a regex, a schema's JSON text or a choice list, as given
    max_regex_chars: int = 200_000  # the regex a schema or choice list becomes
    max_repeat: int = 512  # n in x{n}, x{m,n}; also minLength/maxLength/minItems/maxItems
    max_dfa_states: int = 20_000
    # brackets of a schema's JSON or groups of a regex, nested: the compiler recurses once or more per level,
    # and a schema 480 levels deep ran out of Python's stack (a crash, not a refusal)
    max_nesting: int = 100
    timeout: float = 20.0  # seconds of compiling per constraint, enforced by the server's worker pool
    # compiled token indexes kept for reuse, every tenant's together, each counted at the most it can hold (its
    # arrays and mask rows; index_cache): a server that kept each client's last 32 constraints with every mask row
    # they had visited grew by gigabytes and held them after those requests were done
    cache_bytes: int = 1 << 30

    def __post_init__(self):
        for name in ("max_spec_chars", "max_regex_chars", "max_repeat", "max_dfa_states", "max_nesting", "cache_bytes"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"ConstraintLimits.{name} must be an integer >= 1")
        if not self.timeout > 0:
            raise ValueError("ConstraintLimits.timeout must be > 0 seconds")

    def check_spec(self, kind: str, text: str) -> None:
        if len(text) > self.max_spec_chars:
            raise ValueError(f"the {kind} is {len(text):,} characters long; the limit is {self.max_spec_chars:,} "
                             f"(ConstraintLimits.max_spec_chars)")
        regex = kind == "regex"
        depth = _nesting(text, "([" if regex else "[{", ")]" if regex else "]}", json_text=not regex)
        if depth > self.max_nesting:
            raise ValueError(f"the {kind} nests {depth:,} levels deep; the limit is {self.max_nesting} "
                             f"(ConstraintLimits.max_nesting)")

    def check_regex(self, pattern: str) -> None:
        if len(pattern) > self.max_regex_chars:
            raise ValueError(f"the constraint's regex is {len(pattern):,} characters long; the limit is "
                             f"{self.max_regex_chars:,} (ConstraintLimits.max_regex_chars)")
        for match in _COUNTED.finditer(pattern):
            if len(match.group(1)) % 2:  # an escaped brace is a literal
                continue
            counts = [int(c) for c in match.group(2, 3) if c]
            if max(counts) > self.max_repeat:
                raise ValueError(f"the constraint repeats something {max(counts):,} times ({match.group(0).lstrip(chr(92))}); "
                                 f"the limit is {self.max_repeat:,} (ConstraintLimits.max_repeat): a DFA needs a "
                                 f"state per repetition")


def _nesting(text: str, opening: str, closing: str, json_text: bool) -> int:
    """How deep brackets nest in `text`, skipping escaped characters and JSON strings (a regex's
    character class counts as a level, which only overestimates)."""
    depth = deepest = 0
    in_string = escaped = False
    for c in text:
        if escaped:
            escaped = False
        elif c == "\\":
            escaped = True
        elif json_text and c == '"':
            in_string = not in_string
        elif in_string:
            continue
        elif c in opening:
            depth += 1
            deepest = max(deepest, depth)
        elif c in closing:
            depth -= 1
    return deepest


# x{n}, x{m,}, x{m,n}, with the backslashes before the brace captured to tell a literal brace
_COUNTED = re.compile(r"(\\*)\{(\d+)(?:,(\d*))?\}")
