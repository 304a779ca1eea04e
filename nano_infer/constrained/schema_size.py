"""The length of a JSON Schema's regex, computed from the schema before any of the regex is written.

A schema's regex can be far longer than the schema: an array's items appear twice in it
(`\\[(item(, item)*)?\\]`), an optional property once per option for the object's first member, a
$ref once per use. Nested, these multiply, so a schema of a few hundred bytes can stand for a regex
too large to write, and writing it first and measuring after (ConstraintLimits.max_regex_chars) let
a compile worker grow by gigabytes before the refusal. Here each node's length comes from the
lengths of its children by the same rules `json_schema` writes by; the walk stops at the first node
past the limit, visits each $ref target once, and counts a chain of $refs against
ConstraintLimits.max_nesting (the schema's own brackets were counted before it was parsed).
A malformed node counts as empty: writing the regex refuses it, saying why.
"""
from __future__ import annotations

import functools

from .byte_dfa import strip_anchors, unicode_escapes
from .json_schema import (ANY_JSON_DEPTH, SIMPLE_TYPES, STRING, STRING_CHAR, _any_value, _bounds, _literal, _members,
                          _repeat)
from .limits import ConstraintLimits
from .numbers import numeric_regex


def schema_regex_chars(schema: dict, limits: ConstraintLimits) -> int:
    """len(json_schema_to_regex(schema)), without writing it; ValueError naming the limit when it would be
    longer than limits.max_regex_chars or its $refs nest deeper than limits.max_nesting."""
    return _Lengths(schema, limits).length(schema, "#", 1)[0]


@functools.cache
def _any_object_chars() -> int:
    return len(_members(_any_value(ANY_JSON_DEPTH - 1)))


def _one_of(lengths: list[int]) -> int:
    return 2 + sum(lengths) + len(lengths) - 1


class _Lengths:
    def __init__(self, root: dict, limits: ConstraintLimits):
        self.root, self.limits = root, limits
        self.expanding: list[str] = []  # $refs being expanded (a recursive one is refused when written)
        self.refs: dict[str, tuple[int, int]] = {}  # $ref -> its target's (characters, levels)

    def length(self, node, path: str, depth: int) -> tuple[int, int]:
        """(characters of the node's regex, levels of schemas from the node down)."""
        if depth > self.limits.max_nesting:
            self._too_deep()
        if not isinstance(node, dict):
            return 0, 1
        chars, levels = self._node(node, path, depth)
        self._check(chars, path)
        return chars, levels

    def size(self, fragment: str) -> int:
        """What a piece of regex written as it is counts (its characters; dfa_cost counts otherwise)."""
        return len(fragment)

    def repeat(self, unit: int, lo: int, hi: int | None) -> int:
        """What `unit` repeated lo to hi times counts; a count past limits.max_repeat is refused here, before
        any compile, as the regex would be (whichever backend would compile the schema)."""
        self.limits.check_regex(_repeat(lo, hi))
        return self._repeated(unit, lo, hi)

    def _repeated(self, unit: int, lo: int, hi: int | None) -> int:
        return unit + len(_repeat(lo, hi))  # its regex once, then the {lo,hi} after it

    def any_object(self) -> int:
        return _any_object_chars()

    def _check(self, chars: int, path: str) -> None:
        if chars > self.limits.max_regex_chars:
            raise ValueError(f"the json schema's regex is longer than {self.limits.max_regex_chars:,} characters "
                             f"(ConstraintLimits.max_regex_chars), past it at {path}: an array's items appear twice "
                             f"in its regex and a $ref once per use, so each level of nesting multiplies the length")

    def _too_deep(self):
        raise ValueError(f"the json schema nests more than {self.limits.max_nesting} schemas deep, counting each $ref "
                         f"as a level; the limit is {self.limits.max_nesting} (ConstraintLimits.max_nesting)")

    def _children(self, nodes: list, path: str, depth: int) -> tuple[list[int], int]:
        found = [self.length(n, f"{path}/{i}", depth + 1) for i, n in enumerate(nodes)]
        return [c for c, _ in found], 1 + max((levels for _, levels in found), default=0)

    def _node(self, node: dict, path: str, depth: int) -> tuple[int, int]:
        if "$ref" in node:
            return self._ref(node["$ref"], depth)
        if "const" in node:
            return self.size(_literal(node["const"], path)), 1
        if "enum" in node:
            values = node["enum"]
            return (_one_of([self.size(_literal(v, path)) for v in values]) if isinstance(values, list) and values else 0), 1
        for key in ("anyOf", "oneOf"):
            if key in node:
                options = node[key]
                if not isinstance(options, list) or not options:
                    return 0, 1
                lengths, levels = self._children(options, f"{path}/{key}", depth)
                return _one_of(lengths), levels
        if "allOf" in node:
            parts = node["allOf"]
            if not isinstance(parts, list) or len(parts) != 1:
                return 0, 1
            (chars,), levels = self._children(parts, f"{path}/allOf", depth)
            return chars, levels
        kind = node.get("type")
        if kind is None:
            kind = "object" if "properties" in node else "array" if "items" in node else None
        kinds = kind if isinstance(kind, list) else [kind]
        if not kinds or not all(isinstance(k, str) for k in kinds):
            return 0, 1
        found = [self._typed(k, node, path, depth) for k in kinds]
        chars = [c for c, _ in found]
        return (_one_of(chars) if isinstance(kind, list) else chars[0]), max(levels for _, levels in found)

    def _typed(self, kind: str, node: dict, path: str, depth: int) -> tuple[int, int]:
        if kind in SIMPLE_TYPES:
            return self.size(SIMPLE_TYPES[kind]), 1
        if kind in ("integer", "number"):
            return self.size(numeric_regex(kind, node, path)), 1
        if kind == "string":
            return self._string(node, path), 1
        if kind == "array" and "items" in node:
            return self._array(node, path, depth)
        if kind == "object":
            return self._object(node, path, depth)
        return 0, 1

    def _string(self, node: dict, path: str) -> int:
        lo, hi = _bounds(node, "minLength", "maxLength", path)
        if "pattern" in node:
            pattern = node["pattern"]
            return 4 + self.size(strip_anchors(unicode_escapes(pattern))) if isinstance(pattern, str) else 0
        return 2 + self.repeat(self.size(STRING_CHAR), lo, hi)

    def _array(self, node: dict, path: str, depth: int) -> tuple[int, int]:
        lo, hi = _bounds(node, "minItems", "maxItems", path)
        (item,), levels = self._children([node["items"]], f"{path}/items", depth)
        if hi == 0:
            return 4, levels
        more = self.repeat(4 + item, max(lo - 1, 0), None if hi is None else hi - 1)
        return 4 + item + more + (3 if lo == 0 else 0), levels

    def _object(self, node: dict, path: str, depth: int) -> tuple[int, int]:
        if "properties" not in node:
            extra = node.get("additionalProperties", True)
            if extra is False:
                return 4, 1
            if extra is True:
                return self.any_object(), 1
            (value,), levels = self._children([extra], f"{path}/additionalProperties", depth)
            return 12 + 2 * (self.size(STRING) + 2 + value), levels
        properties, required = node["properties"], node.get("required", [])
        if not isinstance(properties, dict):
            return 0, 1
        required = required if isinstance(required, list) else []
        names = list(properties)
        values, levels = self._children([properties[n] for n in names], f"{path}/properties", depth)
        members = [self.size(_literal(n, path)) + 2 + v for n, v in zip(names, values)]
        needed = [n in required for n in names]
        # what each member costs after the first one present: ", m" if required, "(, m)?" if not
        after = [m + (2 if req else 5) for m, req in zip(members, needed)]
        tail = sum(after)
        options = []
        for m, cost, req in zip(members, after, needed):
            tail -= cost
            options.append(m + tail)
            if req:
                break
        body = _one_of(options) + (0 if any(needed) else 1) if options else 0
        return 4 + body, levels

    def _ref(self, ref, depth: int) -> tuple[int, int]:
        if not isinstance(ref, str) or not ref.startswith("#") or ref in self.expanding:
            return 0, 1
        if ref in self.refs:
            chars, levels = self.refs[ref]
            if depth + levels > self.limits.max_nesting:
                self._too_deep()
            return chars, levels + 1
        target = self.root
        for part in filter(None, ref[1:].split("/")):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, dict) or part not in target:
                return 0, 1
            target = target[part]
        self.expanding.append(ref)
        try:
            self.refs[ref] = self.length(target, ref, depth + 1)
        finally:
            self.expanding.pop()
        chars, levels = self.refs[ref]
        return chars, levels + 1
