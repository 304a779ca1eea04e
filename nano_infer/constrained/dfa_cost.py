"""What compiling a constraint on chapter 07's DFA will cost, estimated from its text before any of it is compiled.

"auto" (backends.py) keeps the DFA for what compiles fast and hands the rest to llguidance, so it needs the
cost before paying it. Two things grow, and both are counted here:

- the byte DFA: about one state per position of the regex, and a counted repetition `x{0,n}` writes its
  `x` n times, so a string's `maxLength: 40` is 40 copies of a JSON character's states. Building it takes
  time that grows faster than its states (interegular's automaton products).
- the token index: from every state, a walk of the vocabulary's trie as far as the DFA lets it. A position
  any character may fill (inside a JSON string, `[^...]`, `.`) lets the walk reach the whole trie, so it costs
  in proportion to the vocabulary; `[a-z]` reaches the many tokens spelled in lowercase, a digit or a literal
  a few.

The estimate counts one per regex position (a literal, a class, an escape), repetitions multiplied out, and
for a class up to `vocab_size // FREE_POSITION_VOCAB` more, in proportion to the characters it takes (all of
it from WIDE on, a free position). A constraint past DFA_BUDGET goes to llguidance under "auto". Both numbers come from compiling schemas on this project's 2-core CPU at SmolLM2's vocabulary (49,152)
and Qwen2.5's (151,936): a budget that keeps a compile under about a second at both.

The walk is schema_size's, whose JSON Schema rules write the regex; nothing is written here.
"""
from __future__ import annotations

import functools
import json
import re

from .json_schema import ANY_JSON_DEPTH, _any_value, _members, load_schema
from .limits import ConstraintLimits
from .schema_size import _Lengths

DFA_BUDGET = 700  # estimated states (free positions weighted) past which "auto" leaves a constraint to llguidance
FREE_POSITION_VOCAB = 5_000  # vocabulary entries per extra state a free position counts
_COUNT = re.compile(r"\{(\d+)(?:(,)(\d*))?\}")
WIDE = 64  # characters a class takes from which its walk reaches as many tokens as a free position's ([a-zA-Z0-9_])
NARROW = 24  # fewer characters than this (digits, hex digits, a few letters): the walk reaches few tokens
_ESCAPE_MEMBERS = {"d": 10, "w": 63, "s": 6, "D": WIDE, "W": WIDE, "S": WIDE}
_CODE_DIGITS = {"x": 2, "u": 4, "U": 8}  # \xHH, \uHHHH, \UHHHHHHHH: one character, as \u{...} and \x{...} are
_BRACED = re.compile(r"\{[0-9a-fA-F]*\}")
_GROUP_NAME = re.compile(r"(\?(P?<[^>]*>|[a-zA-Z]*:|[=!]|<[=!]))?")  # what may follow "(" and is no position
_INLINE_FLAGS = re.compile(r"\(\?[a-zA-Z]+\)")


def dfa_cost(key: tuple[str, str], vocab_size: int, limits: ConstraintLimits = ConstraintLimits()) -> int:
    """The estimate for a constraint key (regex, json_schema or choice) over a vocabulary of `vocab_size`."""
    kind, text = key
    free = vocab_size // FREE_POSITION_VOCAB
    if kind == "regex":
        return regex_cost(text, free)
    if kind == "choice":
        return sum(len(c) for c in json.loads(text)) + 2
    schema = load_schema(text)
    return _Costs(schema, limits, free).length(schema, "#", 1)[0]


def regex_cost(pattern: str, free: int) -> int:
    """One per position, a group's positions times its repetition's upper bound (its lower bound + 1 when it
    has none), and `free` more for a position any character may fill. A linear scan, no parse: alternatives
    add up (an upper bound), and what is not regex syntax counts as a literal."""
    groups = [[0, 0]]  # per open group: [positions so far, positions of the last atom]
    at, end = 0, len(pattern)
    while at < end:
        c = pattern[at]
        if c == "(":
            flags = _INLINE_FLAGS.match(pattern, at)
            if not flags:
                groups.append([0, 0])
            at = flags.end() if flags else _GROUP_NAME.match(pattern, at + 1).end()
            continue
        if c == ")" and len(groups) > 1:
            atom, at = groups.pop()[0], at + 1
        elif c in "*+?" or (c == "{" and _COUNT.match(pattern, at)):
            times, at = _times(pattern, at)
            top = groups[-1]
            top[0] += top[1] * (times - 1)
            top[1] *= times
            continue
        elif c == "|":
            at += 1
            continue
        elif c == "[":
            at, members = _class(pattern, at)
            atom = _weight(members, free)
        elif c == "\\":
            _, members, at = _char(pattern, at)
            atom = _weight(members, free)
        else:
            atom, at = _weight(WIDE if c == "." else 1, free), at + 1
        groups[-1][0] += atom
        groups[-1][1] = atom
    while len(groups) > 1:  # an unclosed group: the DFA refuses it, the count just ends
        groups[-2][0] += groups.pop()[0]
    return groups[0][0]


def _times(pattern: str, at: int) -> tuple[int, int]:
    """(how many copies of the last atom the quantifier at `at` writes, where the scan goes on)."""
    c = pattern[at]
    if c == "{":
        m = _COUNT.match(pattern, at)
        lo, comma, hi = int(m.group(1)), m.group(2), m.group(3)
        times, at = (int(hi) if hi else lo + 1) if comma else lo, m.end()
    else:
        times, at = (2 if c == "+" else 1), at + 1
    if pattern.startswith("?", at) or pattern.startswith("+", at):  # lazy or possessive: the same positions
        at += 1
    return max(times, 1), at


def _weight(members: int, free: int) -> int:
    """A position taking `members` characters: one state, and up to `free` more as it nears WIDE (none below
    NARROW: a vocabulary holds few tokens spelled with digits alone, or hex digits)."""
    return 1 + (free * min(members, WIDE) // WIDE if members >= NARROW else 0)


def _class(pattern: str, at: int) -> tuple[int, int]:
    """(where the character class opening at `at` ends, past its `]`; how many characters it takes, WIDE for a
    negated one). A `]` first in it is a member; `a-z` counts 26."""
    negated = pattern.startswith("^", at + 1)
    i, members, last = at + 1 + negated, 0, None
    first = i
    while i < len(pattern) and (pattern[i] != "]" or i == first):
        if pattern[i] == "-" and last is not None and pattern[i + 1:i + 2] not in ("]", ""):
            high, count, i = _char(pattern, i + 1)
            members += high - last if high is not None and high > last else count
            last = None
            continue
        last, count, i = _char(pattern, i)
        members += count
    return i + 1, WIDE if negated else members


def _char(pattern: str, at: int) -> tuple[int | None, int, int]:
    """(the code point of the character or escape at `at`, None for a class such as \\d; how many characters
    it takes; where the scan goes on). \\xHH, \\uHHHH, \\UHHHHHHHH and \\u{...} are one character."""
    if pattern[at] != "\\" or at + 1 >= len(pattern):
        return ord(pattern[at]), 1, at + 1
    letter = pattern[at + 1]
    if letter in _ESCAPE_MEMBERS:
        return None, _ESCAPE_MEMBERS[letter], at + 2
    if letter in _CODE_DIGITS:
        braced = _BRACED.match(pattern, at + 2)
        digits = braced.group(0)[1:-1] if braced else pattern[at + 2:at + 2 + _CODE_DIGITS[letter]]
        end = braced.end() if braced else at + 2 + len(digits)
        return (int(digits, 16) if digits and all(d in "0123456789abcdefABCDEF" for d in digits) else 0), 1, end
    return ord(letter), 1, at + 2


@functools.cache
def _any_object_cost(free: int) -> int:
    return regex_cost(_members(_any_value(ANY_JSON_DEPTH - 1)), free)


class _Costs(_Lengths):
    """schema_size's walk, counting DFA positions instead of regex characters."""

    def __init__(self, root: dict, limits: ConstraintLimits, free: int):
        super().__init__(root, limits)
        self.free = free

    def size(self, fragment: str) -> int:
        return regex_cost(fragment, self.free)

    def _repeated(self, unit: int, lo: int, hi: int | None) -> int:
        return unit * max(hi if hi is not None else lo + 1, 1)

    def any_object(self) -> int:
        return _any_object_cost(self.free)

    def _check(self, chars: int, path: str) -> None:
        """No limit here: schema_size held the schema to its regex's length before."""
