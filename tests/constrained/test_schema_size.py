"""A schema's regex length, computed before writing it: exact, and refusing a blow-up without building it."""
from __future__ import annotations

import json
import tracemalloc

import pytest
from hypothesis import given, settings, strategies as st

from nano_infer import SamplingParams
from nano_infer.constrained import ConstraintLimits, json_schema_to_regex
from nano_infer.constrained.constraint import check_key, constraint_key, key_regex
from nano_infer.constrained.schema_size import schema_regex_chars
from tests.constrained.test_json_schema import SCHEMAS

UNLIMITED = ConstraintLimits(max_regex_chars=10**12)
NAMES = st.sampled_from(["a", "b", "é", "c d", '"q"'])
LEAVES = st.one_of(
    st.sampled_from([{"type": t} for t in ("string", "integer", "number", "boolean", "null")]),
    st.builds(lambda lo, extra: {"type": "string", "minLength": lo, "maxLength": lo + extra},
              st.integers(0, 5), st.integers(0, 5)),
    st.builds(lambda lo, span: {"type": "integer", "minimum": lo, "maximum": lo + span},
              st.integers(-500, 500), st.integers(0, 2000)),
    st.builds(lambda v: {"enum": v},
              st.lists(st.one_of(st.integers(), st.text(max_size=4), st.none()), min_size=1, max_size=4)),
    st.builds(lambda v: {"const": v}, st.text(max_size=4)),
    st.just({"type": "string", "pattern": "^[a-z]{2}$"}),
    st.just({"$ref": "#/$defs/leaf"}),
)


def _array(item, lo, extra):
    return {"type": "array", "items": item, "minItems": lo, **({} if extra is None else {"maxItems": lo + extra})}


def _object(props, required, extra):
    node = {"type": "object", "properties": props, "required": [n for n in props if n in required]}
    return node if extra is None else {**node, "additionalProperties": extra}


SCHEMA_NODES = st.recursive(LEAVES, lambda inner: st.one_of(
    st.builds(_array, inner, st.integers(0, 2), st.one_of(st.none(), st.integers(0, 3))),
    st.builds(_object, st.dictionaries(NAMES, inner, max_size=4), st.sets(NAMES), st.one_of(st.none(), st.booleans())),
    st.builds(lambda o: {"anyOf": o}, st.lists(inner, min_size=1, max_size=3)),
    st.builds(lambda v: {"type": "object", "additionalProperties": v}, inner),
    st.builds(lambda v: {"allOf": [v]}, inner),
), max_leaves=12)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_the_length_is_the_regex_length(name):
    schema = SCHEMAS[name] if isinstance(SCHEMAS[name], dict) else SCHEMAS[name].model_json_schema()
    assert schema_regex_chars(schema, UNLIMITED) == len(json_schema_to_regex(schema))


@settings(max_examples=200, deadline=None)
@given(SCHEMA_NODES)
def test_the_length_of_any_schema_is_the_regex_length(node):
    schema = {**node, "$defs": {"leaf": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2}}}
    try:
        expected = len(json_schema_to_regex(schema))
    except ValueError:
        return  # a schema the converter refuses (an enum of equal values is fine; a bad node is its to name)
    assert schema_regex_chars(schema, UNLIMITED) == expected


def nested_arrays(levels: int) -> dict:
    schema = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "array", "items": schema}
    return schema


def test_arrays_nested_24_deep_are_refused_before_the_regex_is_written():
    """The probe's schema: under a kilobyte of JSON, a regex doubling per level."""
    schema = nested_arrays(24)
    assert len(json.dumps(schema)) < 1000
    key = constraint_key(SamplingParams(json_schema=schema))
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=r"longer than 200,000 characters \(ConstraintLimits.max_regex_chars\)"):
            check_key(key, ConstraintLimits())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20 * ConstraintLimits().max_regex_chars  # well under one regex of the limit's length, let alone its
    # doubling past it
    with pytest.raises(ValueError, match="max_regex_chars"):
        key_regex(key)  # what a worker runs refuses it first too


def test_refs_used_twice_per_level_are_counted_once_each():
    defs = {"d0": {"type": "string"}}
    for i in range(1, 30):
        below = {"$ref": f"#/$defs/d{i - 1}"}
        defs[f"d{i}"] = {"anyOf": [below, {"type": "array", "items": below}]}
    schema = {"$ref": "#/$defs/d29", "$defs": defs}
    with pytest.raises(ValueError, match="max_regex_chars"):
        schema_regex_chars(schema, ConstraintLimits())
    small = {"$ref": "#/$defs/d3", "$defs": defs}
    assert schema_regex_chars(small, UNLIMITED) == len(json_schema_to_regex(small))


def test_a_chain_of_refs_deeper_than_max_nesting_is_refused_naming_it():
    defs = {"d0": {"type": "string"}}
    for i in range(1, 400):
        defs[f"d{i}"] = {"$ref": f"#/$defs/d{i - 1}"}
    key = constraint_key(SamplingParams(json_schema={"$ref": "#/$defs/d399", "$defs": defs}))
    with pytest.raises(ValueError, match=r"more than 100 schemas deep.*ConstraintLimits.max_nesting"):
        key_regex(key)  # not a RecursionError from the converter


def test_a_type_that_is_not_a_name_is_a_value_error():
    for schema in ({"type": {"a": 1}}, {"type": [["string"]]}):
        assert schema_regex_chars(schema, ConstraintLimits()) == 0  # left to the converter to name
        with pytest.raises(ValueError, match="type's name"):
            json_schema_to_regex(schema)
