"""JSON Schema integers and numbers as regexes: digit counts bounded, minimum/maximum as digit ranges.

An unbounded `{"type": "integer"}` let a small model write digits until max_tokens; every number
is now at most MAX_DIGITS digits before the point and MAX_DIGITS after it (what a float64 holds
exactly: 10**15 - 1 < 2**53), and an exponent of at most 3 digits.

A range of integers is a regex by splitting it where the digit count changes, then by leading
digit: [37, 512] is 3[7-9] | [4-9][0-9] | [1-4][0-9][0-9] | 50[0-9] | 51[0-2]. A bounded number
is an integer part in range with any fraction where every such fraction stays in range, or the
bound itself: within [0, 10] that is [0-9](\\.[0-9]+)? | 10. Values a regex of this shape cannot
single out (0.5 within [0.25, 1], -0.5 within [-1, 0]) are left out, never let through; bounded
numbers have no exponent.
"""
from __future__ import annotations

import math

MAX_DIGITS = 15
INTEGER = rf"-?(0|[1-9][0-9]{{0,{MAX_DIGITS - 1}}})"
FRACTION = rf"(\.[0-9]{{1,{MAX_DIGITS}}})"
NUMBER = INTEGER + FRACTION + r"?([eE][+-]?[0-9]{1,3})?"
LARGEST = 10**MAX_DIGITS - 1


def numeric_regex(kind: str, node: dict, path: str) -> str:
    """The regex of an "integer" or "number" schema, with its minimum/maximum (and exclusive forms)."""
    lo, hi, lo_open, hi_open = _bounds(node, path)
    if lo is None and hi is None:
        return INTEGER if kind == "integer" else NUMBER
    first = -LARGEST if lo is None else math.floor(lo) + 1 if lo_open and lo == math.floor(lo) else math.ceil(lo)
    last = LARGEST if hi is None else math.ceil(hi) - 1 if hi_open and hi == math.ceil(hi) else math.floor(hi)
    parts = [] if first > last else [integer_range(first, last) if kind == "integer" else _number_range(first, last)]
    if kind == "number" and lo_open and lo == math.floor(lo) and lo >= 0 and (hi is None or hi >= lo + 1):
        parts.insert(0, f"{int(lo)}\\.[0-9]{{0,{MAX_DIGITS - 1}}}[1-9]")  # pydantic's gt=0: 0.5 too, and (0, 1)
    if kind == "number" and hi_open and hi == math.ceil(hi) and hi <= 0 and (lo is None or lo <= hi - 1):
        parts.append(f"-{-int(hi)}\\.[0-9]{{0,{MAX_DIGITS - 1}}}[1-9]")  # lt=0: -0.5 too, and (-1, 0)
    if not parts:
        raise ValueError(f"no {kind} lies between the minimum and maximum at {path}")
    return parts[0] if len(parts) == 1 else "(" + "|".join(parts) + ")"


def _bounds(node: dict, path: str):
    values = {}
    for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        value = node.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or isinstance(value, float) and not math.isfinite(value)):
            raise ValueError(f"'{key}' at {path} must be a finite number, got {value!r}")
        if value is not None and abs(value) > LARGEST:  # an int of any size compares (no float conversion)
            shown = repr(value) if isinstance(value, float) or value.bit_length() < 1000 else \
                f"an integer of about {int(value.bit_length() * math.log10(2))} digits"
            raise ValueError(f"'{key}' at {path} is {shown}: numbers have at most {MAX_DIGITS} digits here")
        values[key] = value
    lo, hi = values["minimum"], values["maximum"]
    lo_open = values["exclusiveMinimum"] is not None and (lo is None or values["exclusiveMinimum"] >= lo)
    hi_open = values["exclusiveMaximum"] is not None and (hi is None or values["exclusiveMaximum"] <= hi)
    return (values["exclusiveMinimum"] if lo_open else lo, values["exclusiveMaximum"] if hi_open else hi,
            lo_open, hi_open)


def integer_range(lo: int, hi: int) -> str:
    """A regex of exactly the integers in [lo, hi], written as JSON writes them."""
    parts = []
    if lo < 0:
        parts.append("-" + _natural_range(max(1, -hi), -lo))
    if hi >= 0:
        parts.append(_natural_range(max(0, lo), hi))
    return parts[0] if len(parts) == 1 else "(" + "|".join(parts) + ")"


def _number_range(lo: int, hi: int) -> str:
    """Numbers in [lo, hi] (integer bounds): k.fraction stays in range for k in [lo, hi - 1] when k >= 0
    and for -k in [lo + 1, hi] when k > 0 (-k.5 lies below -k); the bounds themselves exactly."""
    parts = []
    if hi - 1 >= max(lo, 0):
        parts.append(_natural_range(max(lo, 0), hi - 1) + FRACTION + "?")
    if hi >= 0 and hi >= lo:
        parts.append(str(hi))
    if lo < 0 and -lo - 1 >= max(1, -hi):
        parts.append("-" + _natural_range(max(1, -hi), -lo - 1) + FRACTION + "?")
    if lo < 0:
        parts.append(str(lo))
    return "(" + "|".join(parts) + ")"


def _natural_range(lo: int, hi: int) -> str:
    """Integers >= 0 in [lo, hi]: one part per digit count."""
    parts, width = [], len(str(lo))
    while lo <= hi:
        top = min(hi, 10**width - 1)
        parts.append(_same_width(str(lo), str(top)))
        lo, width = top + 1, width + 1
    return parts[0] if len(parts) == 1 else "(" + "|".join(parts) + ")"


def _same_width(lo: str, hi: str) -> str:
    """Numbers of one digit count between lo and hi, by leading digit."""
    if lo == hi:
        return lo
    n = len(lo) - 1
    if lo[1:] == "0" * n and hi[1:] == "9" * n:  # the whole span under each leading digit
        return _digit(lo[0], hi[0]) + (f"[0-9]{{{n}}}" if n > 1 else "[0-9]" if n else "")
    if lo[0] == hi[0]:
        return lo[0] + _same_width(lo[1:], hi[1:])
    parts = [lo[0] + _same_width(lo[1:], "9" * n)]
    if int(hi[0]) - int(lo[0]) > 1:
        parts.append(_digit(str(int(lo[0]) + 1), str(int(hi[0]) - 1)) + (f"[0-9]{{{n}}}" if n > 1 else "[0-9]"))
    parts.append(hi[0] + _same_width("0" * n, hi[1:]))
    return "(" + "|".join(parts) + ")"


def _digit(lo: str, hi: str) -> str:
    return lo if lo == hi else f"[{lo}-{hi}]"
