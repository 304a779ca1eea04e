"""End to end: constrained requests through LLM.generate validate, greedy and sampled.

A random-weight model has no idea what JSON is, which makes it a good adversary: every valid
byte comes from the mask. The schemas have a finite language (bounded strings and arrays, no
free integers) so that every output finishes within max_tokens even when the model would
happily write digits forever.
"""
from __future__ import annotations

import json
import re

import jsonschema
import pytest

from nano_infer import LLM, SamplingParams
from nano_infer.models.loader import TINY_MODEL_DIR

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "city": {"enum": ["北京", "東京", "Paris"]},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 2},
        "mood": {"anyOf": [{"const": "🙂"}, {"type": "null"}]},
    },
    "required": ["name", "city"],
}
PROMPTS = ["Give me a person as JSON:", "你好", "{"]


def check(outputs, schema=SCHEMA):
    for out in outputs:
        for completion in out.outputs:
            assert completion.finish_reason == "stop", completion
            jsonschema.validate(json.loads(completion.text), schema)


@pytest.fixture(scope="module")
def llm(qwen2_dir):
    return LLM(str(qwen2_dir), dtype="float32")


def test_greedy_and_seeded_sampled_outputs_validate(llm):
    greedy = SamplingParams(json_schema=SCHEMA, temperature=0, max_tokens=120)
    check(llm.generate(PROMPTS, greedy))
    sampled = [SamplingParams(json_schema=SCHEMA, temperature=1.0, seed=s, max_tokens=120, n=2) for s in range(3)]
    first = llm.generate(PROMPTS, sampled)
    check(first)
    again = llm.generate(PROMPTS, sampled)
    assert [c.text for o in first for c in o.outputs] == [c.text for o in again for c in o.outputs]


def test_regex_choice_and_unconstrained_share_a_batch(llm):
    params = [SamplingParams(regex=r"[0-9]{3}-[a-z]{2}", temperature=0.8, seed=1, max_tokens=20),
              SamplingParams(choice=["yes", "no", "不知道"], temperature=0, max_tokens=20),
              SamplingParams(temperature=0, max_tokens=8),
              SamplingParams(json_schema=SCHEMA, temperature=0, max_tokens=120)]
    out = llm.generate(["a", "b", "c", "d"], params)
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", out[0].outputs[0].text)
    assert out[1].outputs[0].text in ("yes", "no", "不知道")
    assert len(out[2].outputs[0].token_ids) == 8
    check(out[3:])


def test_a_bad_constraint_is_refused_and_the_engine_keeps_serving(llm):
    with pytest.raises(ValueError, match="at most 15 digits"):
        llm.generate(["x"], SamplingParams(json_schema={"type": "integer", "maximum": 1e20}))
    with pytest.raises(ValueError, match="matches no string"):
        llm.generate(["x"], SamplingParams(regex=r"a[^\s\S]"))
    check(llm.generate(["x"], SamplingParams(json_schema=SCHEMA, temperature=0, max_tokens=120)))


def test_shipped_tiny_model_extracts_json():
    llm = LLM(str(TINY_MODEL_DIR), dtype="float32")
    prompts = ["Ada is 36 and lives in Paris.", "小明住在北京。"]
    check(llm.generate(prompts, SamplingParams(json_schema=SCHEMA, temperature=0, max_tokens=120)))
    check(llm.generate(prompts, SamplingParams(json_schema=SCHEMA, temperature=0.7, seed=0, max_tokens=120, n=2)))
