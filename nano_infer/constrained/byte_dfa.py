"""Regex -> byte-level DFA.

`interegular` parses the regex into a DFA over *characters*. A BPE token, though, is a string of
*bytes* and can end in the middle of a multi-byte UTF-8 character ("é" is C3 A9, and a token may
hold just C3). So the character DFA is rewritten over bytes: every character transition becomes
the UTF-8 byte sequences of its characters, with extra states for "inside a character". Then
states that cannot reach an accepting state are removed, so that whatever state the walk is in,
some continuation can still finish the match, and the DFA is minimised to keep the token index
small.
"""
from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

import interegular
import numpy as np

from .backends import Unsupported

MAX_CODEPOINT = 0x10FFFF
SURROGATES = (0xD800, 0xDFFF)  # not characters: UTF-8 cannot encode them


@dataclass
class ByteDFA:
    """A deterministic automaton over bytes. `transitions[s, b]` is the next state or -1 (reject)."""

    transitions: np.ndarray  # [num_states, 256] int32
    accepting: np.ndarray  # [num_states] bool
    initial: int

    @property
    def num_states(self) -> int:
        return len(self.accepting)

    def walk(self, data: bytes, state: int | None = None) -> int:
        """The state after reading `data`, or -1 if the DFA rejects on the way."""
        state = self.initial if state is None else state
        for byte in data:
            if state < 0:
                break
            state = int(self.transitions[state, byte])
        return state

    def fullmatch(self, data: bytes) -> bool:
        state = self.walk(data)
        return state >= 0 and bool(self.accepting[state])

    @classmethod
    def from_regex(cls, pattern: str, max_states: int | None = None) -> "ByteDFA":
        """The DFA of strings that match `pattern` in full (like re.fullmatch).

        With `max_states`, a pattern whose automaton would be bigger raises ValueError.
        """
        try:
            fsm = interegular.parse_pattern(strip_anchors(unicode_escapes(pattern))).to_fsm()
        except Exception as e:  # interegular raises its own Unsupported / InvalidSyntax
            raise (Unsupported if isinstance(e, interegular.patterns.Unsupported) else ValueError)(
                f"cannot compile regex {_short(pattern)}: {type(e).__name__}: {e}") from e
        _check_states(len(fsm.states), max_states)
        states, initial, accepting = _char_transitions(fsm)
        dfa = _utf8_encode(states, initial, accepting)
        _check_states(dfa.num_states, max_states)
        dfa = _prune(dfa)
        if dfa is None:
            raise ValueError(f"regex {_short(pattern)} matches no string")
        return _minimise(dfa)


def _check_states(num_states: int, max_states: int | None) -> None:
    if max_states is not None and num_states > max_states:
        raise ValueError(f"the constraint's automaton has {num_states:,} states; the limit is {max_states:,} "
                         f"(ConstraintLimits.max_dfa_states)")


def _short(pattern: str, limit: int = 200) -> str:
    """The pattern for an error message, cut if long (a client may send megabytes)."""
    return repr(pattern) if len(pattern) <= limit else repr(pattern[:limit]) + f"... ({len(pattern):,} characters)"


def unicode_escapes(pattern: str) -> str:
    """Write the code point escapes of Python's `re` and ECMA-262 (JSON Schema's patterns) as the
    characters themselves, which interegular understands: \\uXXXX, \\UXXXXXXXX and \\u{X...}.
    A character that is a regex metacharacter keeps a backslash in front of it."""
    return _UNICODE_ESCAPE.sub(_unescape, pattern)


def _unescape(m) -> str:
    if len(m.group(1)) % 2 == 0:  # the backslash before the u is itself escaped: literal text
        return m.group(0)
    char = chr(int(m.group(2) or m.group(3) or m.group(4), 16))
    if 0xD800 <= ord(char) <= 0xDFFF:
        raise ValueError(f"regex escape {m.group(0).lstrip(chr(92))!r} is a lone UTF-16 surrogate, not a character")
    return m.group(1)[:-1] + ("\\" + char if char in _REGEX_META else char)


_UNICODE_ESCAPE = re.compile(r"(\\+)(?:u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8})|u\{([0-9a-fA-F]{1,6})\})")
_REGEX_META = set("\\.^$|?*+()[]{}-/")


def strip_anchors(pattern: str) -> str:
    """Drop a leading ^ and a trailing (unescaped) $: the whole output must match anyway."""
    pattern = pattern[1:] if pattern.startswith("^") else pattern
    trailing_backslashes = len(pattern[:-1]) - len(pattern[:-1].rstrip("\\"))
    if pattern.endswith("$") and trailing_backslashes % 2 == 0:
        pattern = pattern[:-1]
    return pattern


def _char_transitions(fsm) -> tuple[list[list[tuple[int, int, int]]], int, set[int]]:
    """Each state's outgoing transitions as sorted, disjoint codepoint ranges (lo, hi, target).

    interegular groups characters into transition keys; the special key `anything_else` stands
    for every character the pattern never names (what `.` or `[^"]` match), so it becomes the
    complement of all named characters.
    """
    alphabet = fsm.alphabet
    named = sorted(ord(c) for c in alphabet if c is not interegular.fsm.anything_else)
    key_ranges = {}
    for key, symbols in alphabet.by_transition.items():
        points = [ord(c) for c in symbols if c is not interegular.fsm.anything_else]
        ranges = _points_to_ranges(points)
        key_ranges[key] = sorted(ranges + _complement(named)) if interegular.fsm.anything_else in symbols else ranges

    ids = {state: i for i, state in enumerate(sorted(fsm.states, key=lambda s: (s != fsm.initial, s)))}
    states: list[list[tuple[int, int, int]]] = [[] for _ in ids]
    for state, edges in fsm.map.items():
        out = [(lo, hi, ids[target]) for key, target in edges.items() for lo, hi in key_ranges[key]]
        states[ids[state]] = _merge(sorted(out))
    return states, ids[fsm.initial], {ids[s] for s in fsm.finals}


def _points_to_ranges(points: list[int]) -> list[tuple[int, int]]:
    ranges: list[tuple[int, int]] = []
    for p in sorted(points):
        if SURROGATES[0] <= p <= SURROGATES[1]:
            continue
        if ranges and ranges[-1][1] == p - 1:
            ranges[-1] = (ranges[-1][0], p)
        else:
            ranges.append((p, p))
    return ranges


def _complement(sorted_points: list[int]) -> list[tuple[int, int]]:
    """Every codepoint (surrogates excepted) not in `sorted_points`."""
    out, lo = [], 0
    for p in sorted_points + [MAX_CODEPOINT + 1]:
        if p > lo:
            out.append((lo, p - 1))
        lo = max(lo, p + 1)
    return [r for lo, hi in out for r in _minus_surrogates(lo, hi)]


def _minus_surrogates(lo: int, hi: int) -> list[tuple[int, int]]:
    s_lo, s_hi = SURROGATES
    return [(a, b) for a, b in ((lo, min(hi, s_lo - 1)), (max(lo, s_hi + 1), hi)) if a <= b]


def _merge(ranges: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    out: list[tuple[int, int, int]] = []
    for lo, hi, t in ranges:
        if out and out[-1][2] == t and out[-1][1] == lo - 1:
            out[-1] = (out[-1][0], hi, t)
        else:
            out.append((lo, hi, t))
    return out


def _clip(ranges, lo: int, hi: int, shift: int) -> tuple[tuple[int, int, int], ...]:
    """The part of `ranges` inside [lo, hi], moved down by `shift`."""
    i = max(bisect.bisect_right(ranges, (lo, -1, -1)) - 1, 0)
    out = []
    for a, b, t in ranges[i:]:
        if a > hi:
            break
        if b >= lo:
            out.append((max(a, lo) - shift, min(b, hi) - shift, t))
    return tuple(out)


# Lead byte -> (continuation bytes that follow, first codepoint, last codepoint). The bounds
# exclude overlong encodings (C0, C1, E0 80.., F0 80..) and codepoints past U+10FFFF.
def _lead_bytes():
    for b in range(0xC2, 0xE0):
        base = (b & 0x1F) << 6
        yield b, 1, base, base + 0x3F
    for b in range(0xE0, 0xF0):
        base = (b & 0x0F) << 12
        yield b, 2, max(base, 0x800), base + 0xFFF
    for b in range(0xF0, 0xF5):
        base = (b & 0x07) << 18
        yield b, 3, max(base, 0x10000), min(base + 0x3FFFF, MAX_CODEPOINT)


def _utf8_encode(states, initial: int, accepting: set[int]) -> ByteDFA:
    """Rewrite a codepoint-range DFA over bytes.

    A state inside a character is fully described by how many continuation bytes are still to
    come (k) and which codepoints of the remaining block lead where (ranges relative to the
    block's start). States are keyed on exactly that, so "any 2 more bytes, then state 7" is
    built once and shared by every state and lead byte that needs it.
    """
    rows: list[dict[int, int]] = [{} for _ in states]
    inner: dict[tuple, int] = {}

    def inner_state(k: int, ranges: tuple) -> int:
        key = (k, ranges)
        if key in inner:
            return inner[key]
        inner[key] = sid = len(rows)
        rows.append({})
        block = 64 ** (k - 1)
        for c in range(64):
            part = _clip(ranges, c * block, (c + 1) * block - 1, c * block)
            if part:
                rows[sid][0x80 + c] = part[0][2] if k == 1 else inner_state(k - 1, part)
        return sid

    for sid, ranges in enumerate(states):
        for lo, hi, target in _clip(ranges, 0, 0x7F, 0):
            for b in range(lo, hi + 1):
                rows[sid][b] = target
        for lead, k, lo, hi in _lead_bytes():
            base = (lead & (0x3F >> k)) << (6 * k)
            part = _clip(ranges, lo, hi, base)
            if part:
                rows[sid][lead] = inner_state(k, part)

    transitions = np.full((len(rows), 256), -1, dtype=np.int32)
    for sid, row in enumerate(rows):
        if row:
            transitions[sid, list(row)] = list(row.values())
    is_accepting = np.zeros(len(rows), dtype=bool)
    is_accepting[list(accepting)] = True
    return ByteDFA(transitions, is_accepting, initial)


def _prune(dfa: ByteDFA) -> ByteDFA | None:
    """Keep only states reachable from the start that can still reach an accepting state.

    Without this a walk could enter a state from which nothing completes the match, and the
    mask there would allow no token at all. Returns None if the language is empty.
    """
    src, byte = np.nonzero(dfa.transitions >= 0)
    dst = dfa.transitions[src, byte]
    start = np.zeros(dfa.num_states, dtype=bool)
    start[dfa.initial] = True
    live = reaches(dst, src, start) & reaches(src, dst, dfa.accepting)
    if not live[dfa.initial]:
        return None
    keep = np.flatnonzero(live)
    new_id = np.full(dfa.num_states + 1, -1, dtype=np.int32)  # index -1 (reject) stays -1
    new_id[keep] = np.arange(len(keep), dtype=np.int32)
    return ByteDFA(new_id[dfa.transitions[keep]], dfa.accepting[keep], int(new_id[dfa.initial]))


def reaches(src: np.ndarray, dst: np.ndarray, goal: np.ndarray) -> np.ndarray:
    """Which states have a path of edges src[i] -> dst[i] to some state where `goal` is True."""
    n = len(goal)
    pairs = np.unique(dst.astype(np.int64) * n + src)  # sorted by dst: predecessors grouped
    preds, starts = pairs % n, np.searchsorted(pairs // n, np.arange(n + 1))
    seen = goal.copy()
    stack = list(np.flatnonzero(goal))
    while stack:
        d = stack.pop()
        for s in preds[starts[d]:starts[d + 1]]:
            if not seen[s]:
                seen[s] = True
                stack.append(s)
    return seen


def _minimise(dfa: ByteDFA) -> ByteDFA:
    """Merge states with the same future (Moore's partition refinement).

    Two states are split whenever they disagree on accepting or on the class of the state some
    byte leads to; when no class splits any more, each class is one state.
    """
    cls = dfa.accepting.astype(np.int64)
    num = len(np.unique(cls))
    while True:
        targets = np.where(dfa.transitions >= 0, cls[np.maximum(dfa.transitions, 0)], -1)
        signature = np.concatenate([cls[:, None], targets], axis=1)
        ids: dict[bytes, int] = {}
        cls = np.array([ids.setdefault(row.tobytes(), len(ids)) for row in signature], dtype=np.int64)
        if len(ids) == num:
            break
        num = len(ids)
    # Renumber so the start state is 0 and the rest follow in order of first appearance.
    order = np.unique(cls, return_index=True)[1]
    reps = sorted(order, key=lambda s: (cls[s] != cls[dfa.initial], s))
    rename = np.empty(num, dtype=np.int32)
    rename[cls[reps]] = np.arange(num, dtype=np.int32)
    rep_rows = dfa.transitions[reps]
    transitions = np.where(rep_rows >= 0, rename[cls[np.maximum(rep_rows, 0)]], -1).astype(np.int32)
    return ByteDFA(transitions, dfa.accepting[reps], 0)
