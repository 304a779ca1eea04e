"""JSON Schema -> regex, for the subset of JSON Schema that a regex can express.

Whitespace policy: the output is laid out exactly like Python's `json.dumps(value,
ensure_ascii=False)`: no whitespace except one space after every ":" and ",", so
`{"name": "Ada", "tags": ["x", "y"]}`. A fixed layout keeps the DFA small, and a model sees
the spacing most JSON on the web uses. Properties come in schema order; optional ones may be
left out; properties the schema does not list are never produced (additionalProperties can
allow them, never require them).

An object schema without "properties" (what OpenAI's `response_format: json_object` asks for)
is any object: string keys, and values of its additionalProperties schema, or any JSON value
when that is absent or true. Such free values nest at most ANY_JSON_DEPTH levels of arrays and
objects, counting the object itself: a regex cannot count brackets without a bound, and each
level multiplies the regex by four (each level more multiplies the time to build its DFA many times
over). Keys may repeat, as JSON syntax allows.

Supported: type (string, integer, number, boolean, null, array, object, or a list of these),
properties, required, additionalProperties, items, minItems, maxItems, minLength, maxLength,
pattern, enum, const, anyOf, oneOf (whose options must not overlap), allOf of one schema,
local $ref ("#/$defs/..." as pydantic writes them; not recursive), and minimum, maximum,
exclusiveMinimum, exclusiveMaximum (numbers.py, where every number's digits are bounded too). Annotations (title,
description, default, ...) are ignored. Any other keyword raises Unsupported (a ValueError) naming it:
a keyword that is skipped instead could let through output the schema forbids.
"""
from __future__ import annotations

import json

import interegular

from .backends import Unsupported
from .byte_dfa import strip_anchors, unicode_escapes
from .numbers import NUMBER, numeric_regex

# One character of a JSON string: anything but '"', '\' and control characters, or an escape.
# \u escapes of surrogates are left out: a lone one is not a character, and a pair would
# count as two characters here but one after decoding (minLength/maxLength would be off).
STRING_CHAR = (r'([^"\\\x00-\x1f]|\\["\\/bfnrt]'
               r'|\\u([0-9a-cA-CeEfF][0-9a-fA-F]{3}|[dD][0-7][0-9a-fA-F]{2}))')
SIMPLE_TYPES = {"boolean": "(true|false)", "null": "null"}
STRING = '"' + STRING_CHAR + '*"'
SCALAR = "(" + "|".join([STRING, NUMBER, "true", "false", "null"]) + ")"
ANY_JSON_DEPTH = 3

ANNOTATIONS = {"title", "description", "default", "examples", "$schema", "$id", "$comment",
               "deprecated", "readOnly", "writeOnly", "$defs", "definitions"}
SUPPORTED = {"type", "properties", "required", "additionalProperties", "items", "minItems",
             "maxItems", "minLength", "maxLength", "pattern", "enum", "const", "anyOf", "oneOf",
             "allOf", "$ref", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}
REGEX_META = set(r"\.^$|?*+()[]{}")


def escape(text: str) -> str:
    """`text` as a regex that matches exactly it."""
    return "".join("\\" + c if c in REGEX_META else c for c in text)


def json_schema_to_regex(schema) -> str:
    """A regex for the JSON texts valid under `schema` (a dict, a JSON string or a pydantic model class)."""
    schema = load_schema(schema)
    return _Converter(schema).regex(schema, "#")


def load_schema(schema) -> dict:
    if isinstance(schema, type) and hasattr(schema, "model_json_schema"):
        schema = schema.model_json_schema()
    elif isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except RecursionError:
            raise ValueError("json_schema nests deeper than Python's JSON reader goes") from None
        except ValueError as e:  # not JSON, or an integer past Python's limit on digits read
            raise ValueError(f"json_schema is not valid JSON: {e}") from e
    if not isinstance(schema, dict):
        raise ValueError(f"json_schema must be a dict, a JSON string or a pydantic model class, "
                         f"not {type(schema).__name__}")
    return schema


def _literal(value, path: str) -> str:
    """An enum or const value as the JSON text it is produced as; NaN and Infinity are not JSON."""
    try:
        return escape(json.dumps(value, ensure_ascii=False, allow_nan=False))
    except ValueError:
        raise ValueError(f"enum/const at {path} holds {value!r}, which is not a JSON value (NaN and Infinity "
                         f"are not JSON)") from None


def _one_of(options: list[str]) -> str:
    return "(" + "|".join(options) + ")"


class _Converter:
    def __init__(self, root: dict):
        self.root = root
        self.expanding: list[str] = []  # $refs being expanded, to reject recursion

    def regex(self, node, path: str) -> str:
        if not isinstance(node, dict):
            raise ValueError(f"schema at {path} must be an object, got {node!r}")
        unknown = sorted(set(node) - ANNOTATIONS - SUPPORTED)
        if unknown:
            raise Unsupported(f"unsupported JSON Schema keyword {unknown[0]!r} at {path} "
                             f"(supported: {', '.join(sorted(SUPPORTED))})")
        if "$ref" in node:
            return self.ref(node, path)
        if "const" in node:
            return _literal(node["const"], path)
        if "enum" in node:
            values = _list(node, "enum", path)
            return _one_of([_literal(v, path) for v in values])
        for key in ("anyOf", "oneOf"):
            if key in node:
                options = [self.regex(o, f"{path}/{key}/{i}") for i, o in enumerate(_list(node, key, path))]
                if key == "oneOf":
                    _check_disjoint(options, path)
                return _one_of(options)
        if "allOf" in node:
            parts = _list(node, "allOf", path)
            if len(parts) != 1:
                raise Unsupported(f"allOf with {len(parts)} schemas at {path} is not supported (only one)")
            return self.regex(parts[0], f"{path}/allOf/0")
        kind = node.get("type")
        if kind is None:
            kind = "object" if "properties" in node else "array" if "items" in node else None
        if kind is None:
            raise Unsupported(f"schema at {path} gives no type (nor const, enum, anyOf, oneOf, $ref)")
        if isinstance(kind, list):
            if not kind:
                raise ValueError(f"'type' at {path} is an empty list: no value has no type")
            return _one_of([self.typed(k, node, path) for k in kind])
        return self.typed(kind, node, path)

    def typed(self, kind, node: dict, path: str) -> str:
        if not isinstance(kind, str):
            raise ValueError(f"'type' at {path} must be a type's name or a list of names, got {kind!r}")
        if kind in SIMPLE_TYPES:
            return SIMPLE_TYPES[kind]
        if kind in ("integer", "number"):
            return numeric_regex(kind, node, path)
        if kind == "string":
            return self.string(node, path)
        if kind == "array":
            return self.array(node, path)
        if kind == "object":
            return self.object(node, path)
        raise ValueError(f"unknown type {kind!r} at {path}")

    def string(self, node: dict, path: str) -> str:
        lo, hi = _bounds(node, "minLength", "maxLength", path)
        if "pattern" in node:
            if lo or hi is not None:
                raise Unsupported(f"pattern together with minLength/maxLength at {path} is not supported")
            return '"' + _json_safe_pattern(node["pattern"], path) + '"'
        return '"' + STRING_CHAR + _repeat(lo, hi) + '"'

    def array(self, node: dict, path: str) -> str:
        if "items" not in node:
            raise Unsupported(f"array at {path} needs 'items'")
        lo, hi = _bounds(node, "minItems", "maxItems", path)
        item = self.regex(node["items"], f"{path}/items")
        if hi == 0:
            return r"\[\]"
        more = f"(, {item})" + _repeat(max(lo - 1, 0), None if hi is None else hi - 1)
        return r"\[" + (f"({item}{more})?" if lo == 0 else item + more) + r"\]"

    def object(self, node: dict, path: str) -> str:
        if "properties" not in node:
            extra = node.get("additionalProperties", True)
            if extra is False:
                return r"\{\}"
            value = _any_value(ANY_JSON_DEPTH - 1) if extra is True else self.regex(extra, f"{path}/additionalProperties")
            return _members(value)
        properties = node.get("properties")
        if not isinstance(properties, dict):
            raise ValueError(f"'properties' at {path} must be an object, got {properties!r}")
        required = _list(node, "required", path) if "required" in node else []
        missing = [r for r in required if r not in properties]
        if missing:
            raise ValueError(f"required {missing} at {path} are not in properties")
        members = [(f"{_literal(name, path)}: " + self.regex(sub, f"{path}/properties/{name}"), name in required)
                   for name, sub in properties.items()]
        # The first member present has no comma before it: one alternative per candidate for
        # first (every optional member up to and including the first required one).
        options = []
        for i, (member, is_required) in enumerate(members):
            rest = "".join(f", {m}" if req else f"(, {m})?" for m, req in members[i + 1:])
            options.append(member + rest)
            if is_required:
                break
        body = _one_of(options) if options else ""
        if not any(req for _, req in members) and options:
            body += "?"
        return r"\{" + body + r"\}"

    def ref(self, node: dict, path: str) -> str:
        others = sorted(set(node) - ANNOTATIONS - {"$ref"})
        if others:
            raise Unsupported(f"keyword {others[0]!r} next to $ref at {path} is not supported")
        ref = node["$ref"]
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise Unsupported(f"$ref {ref!r} at {path}: only local references ('#/...') are supported")
        if ref in self.expanding:
            raise Unsupported(f"recursive $ref {ref!r} at {path} cannot be expressed as a regex")
        target = self.root
        for part in filter(None, ref[1:].split("/")):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, dict) or part not in target:
                raise ValueError(f"$ref {ref!r} at {path} points to nothing")
            target = target[part]
        self.expanding.append(ref)
        try:
            return self.regex(target, ref)
        finally:
            self.expanding.pop()


def _members(value: str) -> str:
    """An object of any string keys, each with a value matching `value`."""
    member = f"{STRING}: {value}"
    return r"\{(" + member + f"(, {member})*)?" + r"\}"


def _any_value(depth: int) -> str:
    """Any JSON value with at most `depth` levels of arrays and objects."""
    value = SCALAR
    for _ in range(depth):
        array = r"\[(" + value + f"(, {value})*)?" + r"\]"
        value = _one_of([SCALAR, array, _members(value)])
    return value


def _list(node: dict, key: str, path: str) -> list:
    value = node[key]
    if not isinstance(value, list) or (key != "required" and not value):
        raise ValueError(f"'{key}' at {path} must be a non-empty list, got {value!r}")
    return value


def _bounds(node: dict, lo_key: str, hi_key: str, path: str) -> tuple[int, int | None]:
    lo, hi = node.get(lo_key, 0), node.get(hi_key)
    for key, value in ((lo_key, lo), (hi_key, hi)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise ValueError(f"'{key}' at {path} must be an integer >= 0, got {value!r}")
    if hi is not None and hi < lo:
        raise ValueError(f"'{hi_key}' ({hi}) < '{lo_key}' ({lo}) at {path}: nothing is valid")
    return lo, hi


def _repeat(lo: int, hi: int | None) -> str:
    if hi is None:
        return "*" if lo == 0 else f"{{{lo},}}"
    return f"{{{lo}}}" if lo == hi else f"{{{lo},{hi}}}"


def _json_safe_pattern(pattern, path: str) -> str:
    """The pattern, matched in full, if none of its matches needs escaping inside a JSON string.

    JSON Schema's pattern searches the decoded string; a full match is one such string. The
    output is written raw between quotes, so a '"', a backslash or a control character in it
    would end or break the string: such patterns are refused rather than quietly narrowed.
    """
    if not isinstance(pattern, str):
        raise ValueError(f"'pattern' at {path} must be a string")
    pattern = strip_anchors(unicode_escapes(pattern))
    try:
        fsm = interegular.parse_pattern(pattern).to_fsm()
    except Exception as e:
        raise Unsupported(f"cannot compile pattern {pattern!r} at {path}: {e}") from e
    if not (fsm & _UNSAFE).empty():
        raise Unsupported(f"pattern {pattern!r} at {path} can match '\"', '\\' or a control "
                         f"character, which a JSON string must escape; exclude them (e.g. [^\"\\\\])")
    return f"({pattern})"


_UNSAFE = interegular.parse_pattern(r'[\s\S]*["\\\x00-\x1f][\s\S]*').to_fsm()


def _check_disjoint(options: list[str], path: str) -> None:
    """oneOf means exactly one option matches: refuse options whose languages overlap."""
    fsms = [interegular.parse_pattern(o).to_fsm() for o in options]
    for i in range(len(fsms)):
        for j in range(i + 1, len(fsms)):
            if not (fsms[i] & fsms[j]).empty():
                raise Unsupported(f"oneOf at {path}: options {i} and {j} can match the same JSON, "
                                 f"so output could be valid for both (use anyOf)")
