"""vLLM's StructuredOutputsParams / GuidedDecodingParams through LLM.generate, as its structured-outputs
example writes them; JSON Schema number bounds end to end (a random model writes digits until the mask stops it)."""
import json
import re

import jsonschema
import pytest
from pydantic import BaseModel, Field

from nano_infer import LLM
from nano_infer.sampling_params import GuidedDecodingParams, SamplingParams, StructuredOutputsParams


class Order(BaseModel):
    item: str = Field(max_length=6)
    quantity: int = Field(ge=1, le=12)
    price: float = Field(gt=0, le=500)
    count: int  # no bounds: its digits are bounded


@pytest.fixture(scope="module")
def llm(qwen2_dir):
    return LLM(str(qwen2_dir), dtype="float32", block_size=4)


def text(llm, params):
    return [c.text for o in llm.generate(["Classify: nano_infer is wonderful!", "An order:"], params)
            for c in o.outputs]


@pytest.mark.parametrize("temperature", [0, 1.0])
def test_structured_outputs_params_constrain(llm, temperature):
    def ask(so):
        return text(llm, SamplingParams(temperature=temperature, seed=3, max_tokens=150, structured_outputs=so))

    assert set(ask(StructuredOutputsParams(choice=["Positive", "Negative"]))) <= {"Positive", "Negative"}
    assert all(re.fullmatch(r"[a-z]{1,8}@[a-z]{1,8}\.com", t) for t in ask(StructuredOutputsParams(regex=r"[a-z]{1,8}@[a-z]{1,8}\.com")))
    for t in ask(StructuredOutputsParams(json=Order.model_json_schema())):
        Order.model_validate_json(t)  # ge/le/gt hold: the bounds are in the mask
    # json_object is any object, whose free strings a random model never ends: the mapping is what is checked
    assert SamplingParams(structured_outputs=StructuredOutputsParams(json_object=True)).json_schema == {"type": "object"}
    old = text(llm, SamplingParams(temperature=temperature, seed=3, max_tokens=150,
                                   guided_decoding=GuidedDecodingParams(json=Order, backend="xgrammar")))
    for t in old:
        jsonschema.validate(json.loads(t), Order.model_json_schema())


def test_a_prompts_cache_salt_keeps_the_structured_output(llm):
    """generate copies the params for a salted prompt (dataclasses.replace): the mapped constraint must survive."""
    params = SamplingParams(temperature=0, max_tokens=8, structured_outputs=StructuredOutputsParams(choice=["yes", "no"]))
    out = llm.generate([{"prompt": "Well?", "cache_salt": "a"}, "Well?"], params)
    assert [o.outputs[0].text in ("yes", "no") for o in out] == [True, True]


@pytest.mark.parametrize("make,match", [
    (lambda: StructuredOutputsParams(grammar="root ::= 'a'"), "grammar"),
    (lambda: StructuredOutputsParams(), "exactly one"),
    (lambda: StructuredOutputsParams(regex="a", choice=["b"]), "exactly one"),
    (lambda: StructuredOutputsParams(json={}, whitespace_pattern=" *"), "whitespace_pattern"),
    (lambda: SamplingParams(regex="a", structured_outputs=StructuredOutputsParams(choice=["b"])), "one constraint"),
    (lambda: SamplingParams(structured_outputs={"regex": "a"}), "StructuredOutputsParams"),
])
def test_what_cannot_be_honoured_is_refused(make, match):
    with pytest.raises(ValueError, match=match):
        make()
