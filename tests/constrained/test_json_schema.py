"""JSON Schema -> regex: valid documents match, constrained walks validate, bad schemas are refused."""
from __future__ import annotations

import enum
import json
import re
from typing import Literal, Optional

import jsonschema
import pytest
from hypothesis import given, settings, strategies as st
from pydantic import BaseModel, Field

from nano_infer import SamplingParams
from nano_infer.constrained import build_constraint, json_schema_to_regex
from tests.helpers.byte_bpe import byte_bpe_tokenizer, byte_bpe_vocabulary
from tests.helpers.walks import chooser, walk


class Color(str, enum.Enum):
    red = "red"
    green = "绿色"


class Address(BaseModel):
    city: str = Field(max_length=12)
    zip: Optional[str] = Field(default=None, pattern=r"^[0-9]{5}$")


class Person(BaseModel):
    name: str
    age: int
    color: Color
    home: Address
    nicknames: list[str] = Field(default_factory=list, max_length=3)
    kind: Literal["human", "robot"] = "human"
    score: Optional[float] = None


SCHEMAS = {
    "flat": {"type": "object",
             "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 10},
                            "age": {"type": "integer"}, "ok": {"type": "boolean"},
                            "score": {"type": "number"}, "none": {"type": "null"}},
             "required": ["name", "age"]},
    "all_optional": {"type": "object",
                     "properties": {"a": {"type": "integer"}, "b": {"type": "string", "maxLength": 3},
                                    "c": {"enum": [1, "x", None]}}},
    "nested": {"type": "object",
               "properties": {"user": {"type": "object",
                                       "properties": {"id": {"type": "integer"},
                                                      "tags": {"type": "array", "items": {"type": "string", "maxLength": 4},
                                                               "minItems": 1, "maxItems": 3}},
                                       "required": ["id", "tags"]},
                              "city": {"enum": ["北京", "上海", "東京"]},
                              "mood": {"const": "😀"}},
               "required": ["user", "city"]},
    "anyof": {"type": "object",
              "properties": {"value": {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 5},
                                                 {"type": "array", "items": {"type": ["boolean", "null"]}, "maxItems": 2}]},
                             "code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"}},
              "required": ["value", "code"]},
    "oneof": {"oneOf": [{"type": "integer"}, {"type": "string", "maxLength": 6}]},
    "pydantic": Person.model_json_schema(),
    "any_object": {"type": "object"},  # response_format json_object
    "dict_of_ints": {"type": "object", "additionalProperties": {"type": "integer"}},
    "empty_object": {"type": "object", "additionalProperties": False},
    # pydantic's Field(ge=0, le=150), Field(gt=0, le=1000), Field(ge=-20, lt=20)
    "bounded": {"type": "object", "properties": {
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "price": {"type": "number", "exclusiveMinimum": 0, "maximum": 1000},
        "delta": {"type": "integer", "minimum": -20, "exclusiveMaximum": 20}}, "required": ["age", "price", "delta"]},
}

VALID = {
    "flat": [{"name": "Ada", "age": 36}, {"name": "北京🙂", "age": -1, "ok": True, "score": 1.5e3, "none": None},
             {"name": 'q"\\\n', "age": 0, "score": -0.25}],
    "all_optional": [{}, {"b": "xy"}, {"a": 1, "c": None}, {"c": "x"}],
    "nested": [{"user": {"id": 7, "tags": ["a", "数据"]}, "city": "東京", "mood": "😀"}],
    "anyof": [{"value": 3, "code": "AB-123"}, {"value": "短", "code": "ZZ-000"}, {"value": [True, None], "code": "AA-111"}],
    "oneof": [12, "twelve"],
    "pydantic": [Person(name="Ada", age=36, color=Color.green, home=Address(city="上海", zip="20000"),
                        nicknames=["A", "🙂"], score=2.5).model_dump(mode="json")],
    "any_object": [{}, {"a": 1}, {"": None, "北京": "🙂", "x": -2.5e3}, {"k": [1, "x", None, True]},
                   {"n": {"m": [False, 1], "e": {}}, "l": [[1], {"z": "w"}]}, {"a": {"b": {}}}],
    "dict_of_ints": [{}, {"a": 1, "b": -20}],
    "empty_object": [{}],
    "bounded": [{"age": 0, "price": 0.5, "delta": -20}, {"age": 150, "price": 1000, "delta": 19},
                {"age": 37, "price": 999.25, "delta": 0}],
}

INVALID = {
    "flat": ['{"age": 36}', '{"name": "", "age": 1}', '{"name":"Ada","age":36}', '{"age": 36, "name": "Ada"}',
             '{"name": "Ada", "age": 1.5}', '{"name": "Ada", "age": 01}',
             '{"name": "a\\x", "age": 1}',
             '{"name": "Ada", "age": 1234567890123456}'],  # 16 digits: every integer's digits are bounded
    "all_optional": ['{, "b": "x"}', '{"a": 1,}', '{"b": "long"}'],
    "nested": ['{"user": {"id": 7, "tags": []}, "city": "北京"}', '{"user": {"id": 7, "tags": ["a"]}, "city": "巴黎"}'],
    "anyof": ['{"value": 3, "code": "ab-123"}'],
    "oneof": ["1.5"],
    "pydantic": [],
    # a fourth level of nesting, a trailing comma, a non-string key, another layout, not an object
    "any_object": ['{"a": {"b": {"c": [1]}}}', '{"a": [[[1]]]}', '{"a": [[{}]]}', '{"a": 1,}', '{1: 2}', '{"a":1}', "[1]", '"x"'],
    "dict_of_ints": ['{"a": "1"}', '{"a": 1.5}'],
    "empty_object": ['{"a": 1}'],
    "bounded": ['{"age": 151, "price": 1, "delta": 0}', '{"age": -1, "price": 1, "delta": 0}',
                '{"age": 1, "price": 0, "delta": 0}', '{"age": 1, "price": 1000.5, "delta": 0}',
                '{"age": 1, "price": 1, "delta": 20}', '{"age": 1, "price": 1, "delta": -21}'],
}


def dumps(value) -> str:
    """The layout the regex fixes: json.dumps' defaults, characters unescaped."""
    return json.dumps(value, ensure_ascii=False)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_valid_documents_match_and_invalid_ones_do_not(name):
    pattern = json_schema_to_regex(SCHEMAS[name])
    for value in VALID[name]:
        jsonschema.validate(value, SCHEMAS[name])
        assert re.fullmatch(pattern, dumps(value)), dumps(value)
    for text in INVALID[name]:
        assert not re.fullmatch(pattern, text), text


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(sorted(SCHEMAS)), wide=st.booleans(), data=st.data())
def test_constrained_walks_produce_valid_json(name, wide, data):
    vocab = byte_bpe_vocabulary()
    constraint = build_constraint(SamplingParams(json_schema=SCHEMAS[name]), vocab, "cpu", backend="nano")
    text = walk(constraint, vocab, chooser(data), free_steps=25, prefer_non_ascii=wide).decode("utf-8")
    jsonschema.validate(json.loads(text), SCHEMAS[name])


def test_chinese_and_emoji_tokens_inside_strings():
    """A tokenizer's own split of multi-byte text (it cuts characters apart) walks through the mask."""
    vocab, tok = byte_bpe_vocabulary(), byte_bpe_tokenizer()
    value = VALID["nested"][0]
    ids = tok.encode(dumps(value))
    assert any(not vocab.token_bytes[i].decode("utf-8", "ignore") for i in ids)  # a partial character
    constraint = build_constraint(SamplingParams(json_schema=SCHEMAS["nested"]), vocab, "cpu")
    for i in ids:
        assert constraint.mask()[i] == 0
        constraint.advance(i)
    assert constraint.is_accepting
    assert json.loads(b"".join(vocab.token_bytes[i] for i in ids).decode("utf-8")) == value


def test_schema_as_json_string_and_as_pydantic_class():
    schema = SCHEMAS["flat"]
    assert json_schema_to_regex(json.dumps(schema)) == json_schema_to_regex(schema)
    assert json_schema_to_regex(Person) == json_schema_to_regex(Person.model_json_schema())


def test_choice_is_an_alternation_of_literals():
    vocab, tok = byte_bpe_vocabulary(), byte_bpe_tokenizer()
    labels = ["a.b", "(x)", "北京?"]
    for label in labels:
        c = build_constraint(SamplingParams(choice=labels), vocab, "cpu")
        for i in tok.encode(label):
            c.advance(i)
        assert c.is_done
    c = build_constraint(SamplingParams(choice=labels), vocab, "cpu")
    with pytest.raises(ValueError, match="not allowed"):
        c.advance(tok.convert_tokens_to_ids("z"))


BAD = [
    ('{"type": "object", ', "not valid JSON"),
    ({"type": "strin"}, "unknown type 'strin'"),
    ({"type": "integer", "multipleOf": 3}, "keyword 'multipleOf' at #"),
    ({"type": "integer", "minimum": 5, "exclusiveMaximum": 5}, "no integer lies between"),
    ({"type": "number", "maximum": 1e20}, "at most 15 digits"),
    ({"type": "number", "minimum": "0"}, "'minimum' at # must be a finite number"),
    ({"type": "object", "properties": {"d": {"type": "string", "format": "date"}}}, "'format' at #/properties/d"),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["b"]}, "not in properties"),
    ({"type": "object", "properties": [1]}, "'properties' at # must be an object"),
    ({"type": "object", "additionalProperties": {"type": "date"}}, "unknown type 'date' at #/additionalProperties"),
    ({"type": "array"}, "needs 'items'"),
    ({"type": "string", "minLength": 5, "maxLength": 2}, "nothing is valid"),
    ({"type": "string", "pattern": "^.+$"}, "must escape"),
    ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "use anyOf"),
    ({"$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}}}, "$ref": "#/$defs/n"}, "recursive"),
    ({"$ref": "#/$defs/missing"}, "points to nothing"),
    ({}, "gives no type"),
    ([1, 2], "must be a dict"),
]


@pytest.mark.parametrize("schema,message", BAD, ids=[m for _, m in BAD])
def test_bad_schemas_are_refused_with_a_reason(schema, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        build_constraint(SamplingParams(json_schema=schema), byte_bpe_vocabulary(), "cpu", backend="nano")


@pytest.mark.parametrize("pattern,message", [
    (r"a[^\s\S]b", "matches no string"),
    (r"(unclosed", "cannot compile regex"),
    (r"a\1", "cannot compile regex"),
])
def test_bad_regexes_are_refused_with_a_reason(pattern, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        build_constraint(SamplingParams(regex=pattern), byte_bpe_vocabulary(), "cpu", backend="nano")


def test_a_schema_string_too_deep_or_with_a_number_too_long_to_read_is_a_value_error():
    from nano_infer.constrained.json_schema import load_schema

    with pytest.raises(ValueError, match="nests deeper"):
        load_schema("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match="not valid JSON"):
        load_schema('{"minimum": ' + "9" * 5000 + "}")
