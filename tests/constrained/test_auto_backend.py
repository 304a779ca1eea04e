"""structured_outputs_config backend "auto": chapter 07's DFA for what it expresses and compiles fast, llguidance for
what it refuses as unsupported or would compile slowly (dfa_cost), the limits refusing for both.

Routing depends on the vocabulary's size (a free-text position costs the token index a walk of the whole trie), so
the routing cases run on the test tokenizer's vocabulary padded with empty entries to SmolLM2's and Qwen2.5's sizes:
what is routed is decided from the size, what is compiled from the tokens.
"""
from __future__ import annotations

import json
import re

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nano_infer import LLM, SamplingParams
from nano_infer.constrained import ConstraintLimits, TokenIndex, build_constraint, json_schema_to_regex
from nano_infer.constrained.backends import ToLibrary
from nano_infer.constrained.constraint import check_key, compile_any, compile_index, constraint_key
from nano_infer.constrained.dfa_cost import DFA_BUDGET, FREE_POSITION_VOCAB, dfa_cost, regex_cost
from tests.helpers.byte_bpe import byte_bpe_vocabulary

SMOL, QWEN = 49_152, 151_936


def person(max_length: int | None) -> dict:
    """instructor's example: a name and an age."""
    name = {"type": "string"} | ({"maxLength": max_length} if max_length else {})
    return {"type": "object", "properties": {"name": name, "age": {"type": "integer"}}, "required": ["name", "age"]}


WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}}, "required": ["city"]}  # README
TREE = {"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer", "minimum": 0, "maximum": 9},
                                                            "kids": {"type": "array", "items": {"$ref": "#/$defs/node"},
                                                                     "maxItems": 2}},
                           "required": ["v"]}},
        "$ref": "#/$defs/node"}
SHORT = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"},
                                          "tags": {"type": "array", "items": {"type": "string"}}},
         "required": ["name", "age"]}
# (constraint, expected backend at SmolLM2's vocabulary size, at Qwen2.5's)
CASES = {
    "instructor maxLength 40": ({"json_schema": person(40)}, "guidance", "guidance"),
    "README get_weather": ({"json_schema": WEATHER}, "guidance", "guidance"),
    "json_object": ({"json_schema": {"type": "object"}}, "guidance", "guidance"),
    "instructor, no maxLength": ({"json_schema": person(None)}, "nano", "nano"),
    "maxLength 8, free tags": ({"json_schema": SHORT}, "nano", "nano"),
    "maxLength 20": ({"json_schema": person(20)}, "nano", "guidance"),
    "maxLength 32": ({"json_schema": person(32)}, "guidance", "guidance"),
    "32 integers": ({"json_schema": {"type": "array", "items": {"type": "integer"}, "maxItems": 32}}, "nano", "nano"),
    "recursive $ref": ({"json_schema": TREE}, "guidance", "guidance"),
    "multipleOf": ({"json_schema": {"type": "integer", "multipleOf": 5}}, "guidance", "guidance"),
    "format": ({"json_schema": {"type": "string", "format": "date"}}, "guidance", "guidance"),
    "oneOf overlapping": ({"json_schema": {"oneOf": [{"type": "integer"}, {"type": "number"}]}}, "guidance", "guidance"),
    "regex, digits": ({"regex": r"\d{3}-\d{4}"}, "nano", "nano"),
    "regex, 100 alphanumerics": ({"regex": "[a-zA-Z0-9 ]{1,100}"}, "guidance", "guidance"),
    "regex, 40 lowercase": ({"regex": "[a-z]{1,40}"}, "nano", "nano"),
    "regex, 100 of any": ({"regex": "[^\\n]{1,100}"}, "guidance", "guidance"),
    "regex, Unicode class": ({"regex": r"\p{L}{2}"}, "guidance", "guidance"),
    "choice": ({"choice": ["yes", "no"]}, "nano", "nano"),
}


@pytest.fixture(scope="module")
def vocabs():
    return {SMOL: byte_bpe_vocabulary(SMOL), QWEN: byte_bpe_vocabulary(QWEN)}


def routed(constraint: dict, vocab) -> str:
    key = constraint_key(SamplingParams(**constraint))
    return "nano" if isinstance(compile_index(key, vocab, auto=True), TokenIndex) else "guidance"


@pytest.mark.parametrize("name", CASES)
def test_auto_routes_each_case_where_expected(name, vocabs):
    constraint, at_smol, at_qwen = CASES[name]
    assert (routed(constraint, vocabs[SMOL]), routed(constraint, vocabs[QWEN])) == (at_smol, at_qwen)


def test_what_auto_sends_to_llguidance_compiles_there_and_nano_refuses_naming_it(vocabs):
    vocab = vocabs[QWEN]
    for constraint, why in (({"json_schema": TREE}, "recursive $ref '#/$defs/node'"),
                            ({"json_schema": {"type": "integer", "multipleOf": 5}}, "'multipleOf' at #"),
                            ({"json_schema": {"type": "string", "format": "date"}}, "'format' at #"),
                            ({"regex": r"\p{L}{2}"}, "cannot compile regex")):
        params = SamplingParams(**constraint)
        assert type(build_constraint(params, vocab)).__name__ == "GrammarConstraint"
        with pytest.raises(ValueError, match=re.escape(why)):
            build_constraint(params, vocab, backend="nano")
    with pytest.raises(ValueError, match="(?s)regex is not valid: .* backreferences are not supported"):
        build_constraint(SamplingParams(regex=r"(a)\1"), vocab)  # neither takes it: llguidance's refusal


def test_the_limits_refuse_whoever_would_compile(vocabs):
    """A regex past its length limit, and a bound past 15 digits, are refused under auto as under nano."""
    limits = ConstraintLimits(max_regex_chars=300)
    nested = {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "array", "items": person(4)}}}}
    for backend in ("auto", "nano"):
        with pytest.raises(ValueError, match="max_regex_chars"):
            compile_any(constraint_key(SamplingParams(json_schema=nested)), vocabs[QWEN], limits, backend)
        with pytest.raises(ValueError, match="at most 15 digits"):
            compile_any(("json_schema", '{"type": "integer", "maximum": 1e20}'), vocabs[QWEN], backend=backend)


def test_a_count_past_the_repeat_limit_is_refused_before_any_compile(vocabs):
    for constraint in ({"json_schema": person(2_000)}, {"regex": "[a-z]{1,2000}"}):
        key = constraint_key(SamplingParams(**constraint))
        with pytest.raises(ValueError, match=r"2,000 times .* \(ConstraintLimits.max_repeat\)"):
            check_key(key)
        for backend in ("auto", "nano"):
            with pytest.raises(ValueError, match="max_repeat"):
                compile_any(key, vocabs[SMOL], backend=backend)


@pytest.mark.parametrize("pattern,positions", [
    (r"\d{3}-\d{4}", 8), (r"(?:ab){3}", 6), (r"(?P<x>a|bc){2,4}", 12), (r"\u00e9{3}x*", 4), (r"[^\]a]+", 2),
    (r"(a|b)*a(a|b){11}", 25), (r"(?i)abc", 3), (r"x\{3}", 4),
])
def test_regex_cost_counts_positions_times_repetitions(pattern, positions):
    assert regex_cost(pattern, 0) == positions


def test_free_positions_weigh_by_vocabulary():
    assert regex_cost(r"[^x]{4}\d.", 10) == 4 * 11 + 1 + 11
    # a class weighs by the characters it takes, out of 64 (none below 24): 26 lowercase letters, 63, 4, 22
    assert [regex_cost(p, 64) for p in (r"[a-z]", r"[\u0041-\u005A]{2}", r"[a-zA-Z0-9 ]", r"[a-d]", r"\w",
                                        r"[0-9a-fA-F]")] == [27, 54, 64, 1, 64, 1]
    # A JSON string's character at Qwen's size (30 per free position): [^"\\\x00-\x1f] is free (30); the hex
    # digits of a \\u escape and the age's digits take fewer than 24 characters (none). Ten characters: 10 * 30.
    key = ("json_schema", json.dumps(person(10)))
    assert QWEN // FREE_POSITION_VOCAB == 30 and dfa_cost(key, QWEN) - dfa_cost(key, 1) == 10 * 30


SUBSET = st.recursive(
    st.sampled_from([{"type": "integer"}, {"type": "boolean"}, {"type": "number", "minimum": 0, "maximum": 99},
                     {"enum": ["a", "b c", "北京"]}, {"type": "null"}]) |
    st.integers(0, 6).map(lambda n: {"type": "string", "maxLength": n}) |
    st.just({"type": "string", "pattern": "[a-z]{2}[0-9]?"}),
    lambda inner: st.lists(inner, min_size=1, max_size=3).map(
        lambda items: {"type": "object", "properties": {f"k{i}": s for i, s in enumerate(items)},
                       "required": ["k0"]}) |
    st.tuples(inner, st.integers(0, 3)).map(lambda t: {"type": "array", "items": t[0], "maxItems": t[1]}) |
    st.lists(inner, min_size=2, max_size=2).map(lambda options: {"anyOf": options}),
    max_leaves=5)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=SUBSET)
def test_the_estimate_follows_the_regex_the_schema_is_written_as(schema):
    """dfa_cost walks the schema by json_schema's rules without writing the regex: it counts at least what the
    written regex has, and at most twice that (it also counts brackets and separators a DFA spends no state on)."""
    written = regex_cost(json_schema_to_regex(schema), QWEN // FREE_POSITION_VOCAB)
    assert written <= dfa_cost(("json_schema", json.dumps(schema)), QWEN) <= 2 * written + 8


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(schema=SUBSET)
def test_auto_keeps_the_dfa_for_the_subset_within_budget(schema, vocabs):
    """What the DFA expresses and the estimate keeps under budget is compiled by the DFA, as under nano."""
    key = ("json_schema", json.dumps(schema))
    if dfa_cost(key, SMOL) <= DFA_BUDGET:
        assert isinstance(compile_index(key, vocabs[SMOL], auto=True), TokenIndex)
    else:
        assert isinstance(compile_index(key, vocabs[SMOL], auto=True), ToLibrary)


@pytest.fixture(scope="module")
def llm(qwen2_dir):
    return LLM(str(qwen2_dir), dtype="float32")


LONG_NAME = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 60},
                                             "age": {"type": "integer", "minimum": 0, "maximum": 120}},
             "required": ["name", "age"]}


@pytest.mark.parametrize("schema", [TREE, LONG_NAME, {"type": "object", "properties": {
    "n": {"type": "integer", "multipleOf": 5, "minimum": 0, "maximum": 100}, "day": {"type": "string", "format": "date"}},
    "required": ["n", "day"]}], ids=["recursive", "maxLength 60", "multipleOf+format"])
def test_routed_requests_give_valid_json(llm, schema):
    key = constraint_key(SamplingParams(json_schema=schema))
    assert type(compile_any(key, llm.engine.vocabulary)).__name__ == "GrammarIndex"  # routed, at this vocabulary too
    outs = llm.generate(["{", "x"], SamplingParams(temperature=0, max_tokens=120, json_schema=schema))
    outs += llm.generate(["{"], SamplingParams(temperature=1.0, seed=1, n=2, max_tokens=120, json_schema=schema))
    for completion in (c for o in outs for c in o.outputs):
        assert completion.finish_reason == "stop", completion
        jsonschema.validate(json.loads(completion.text), schema, format_checker=jsonschema.FormatChecker())
