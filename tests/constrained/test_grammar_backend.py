"""The llguidance backend: GBNF grammars and structural tags, beside chapter 07's DFA, behind one Constraint shape.

A random-weight model knows no grammar, so every well-formed output comes from the masks. The grammar is
context-free (nested parentheses, which no regex counts), with depth and numbers bounded so that greedy
output finishes within max_tokens.
"""
from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from nano_infer import LLM, SamplingParams
from nano_infer.api_server import BackgroundServer
from nano_infer.async_engine.async_llm import AsyncLLM
from nano_infer.constrained import TokenVocabulary, build_constraint
from nano_infer.constrained.backends import backend_of
from nano_infer.sampling_params import StructuredOutputsParams

GBNF = r'''root ::= "(" list ")"
list ::= item ("," item)?
item ::= [0-9] | "(" [0-9] ("," [0-9])? ")"
'''
PROMPTS = ["Numbers: (1,(2,3))", "x"]
TAG = {"type": "structural_tag", "triggers": ["<call="],
       "structures": [{"begin": "<call=w>", "end": "</call>",
                       "schema": {"type": "object", "properties": {"c": {"enum": ["Paris", "Rome"]}}, "required": ["c"]}}]}


def parses(text: str) -> bool:
    """A recognizer for GBNF written by hand: ( item [, item] ), an item a digit or ( digit [, digit] )."""
    def item(at: int) -> int:
        if at < len(text) and text[at].isdigit():
            return at + 1
        if text[at:at + 1] != "(" or not text[at + 1:at + 2].isdigit():
            return -1
        at += 2
        if text[at:at + 1] == "," and text[at + 1:at + 2].isdigit():
            at += 2
        return at + 1 if text[at:at + 1] == ")" else -1

    if text[:1] != "(":
        return False
    at = item(1)
    if at > 0 and text[at:at + 1] == ",":
        at = item(at + 1)
    return at > 0 and text[at:] == ")"


def test_recognizer_can_refuse():
    assert parses("(1,(2,3))") and parses("((4))") and not parses("(1,2,3)") and not parses("((1,2)") \
        and not parses("(1))")


@pytest.fixture(scope="module")
def llm(qwen2_dir):
    return LLM(str(qwen2_dir), dtype="float32")


def test_gbnf_constrains_greedy_and_sampled_output(llm):
    greedy = SamplingParams(temperature=0, max_tokens=30, structured_outputs=StructuredOutputsParams(grammar=GBNF))
    sampled = SamplingParams(temperature=1.0, seed=3, n=3, max_tokens=30, grammar=GBNF)
    outs = llm.generate(PROMPTS, greedy) + llm.generate(PROMPTS[:1], sampled)
    for completion in (c for o in outs for c in o.outputs):
        assert completion.finish_reason == "stop" and parses(completion.text), completion


def test_masks_equal_the_dfas_for_the_same_language(llm):
    """GBNF is regular (depth bounded): its regex through chapter 07's DFA must give the same seeded samples."""
    regex = r"\(([0-9]|\([0-9](,[0-9])?\))(,([0-9]|\([0-9](,[0-9])?\)))?\)"
    texts = [[c.text for c in llm.generate(PROMPTS[:1], SamplingParams(temperature=1.0, seed=5, n=4, max_tokens=30,
                                                                        **kw))[0].outputs]
             for kw in ({"grammar": GBNF}, {"regex": regex})]
    assert texts[0] == texts[1] and len(set(texts[0])) > 1, texts


def test_ngram_speculation_keeps_the_output(llm, qwen2_dir):
    spec = LLM(str(qwen2_dir), dtype="float32", speculative_config={
        "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1})
    params = SamplingParams(temperature=0, max_tokens=30, grammar=GBNF)
    assert [o.outputs[0].text for o in spec.generate(PROMPTS, params)] == \
        [o.outputs[0].text for o in llm.generate(PROMPTS, params)]


def test_structural_tag_holds_its_schema_after_the_trigger(tokenizer):
    vocab = TokenVocabulary.from_tokenizer(tokenizer)
    c = build_constraint(SamplingParams(structural_tag=json.dumps(TAG)), vocab)
    assert c.is_accepting  # free text, empty included
    for token in tokenizer.encode("hi <call=w>", add_special_tokens=False):
        assert c.allows(token)
        c.advance(token)
    assert not c.is_accepting
    text = '{"c":"Rome"}</call>'
    allowed = [t for t in range(vocab.vocab_size) if c.mask()[t] == 0]
    assert allowed and all(text.encode().startswith(vocab.token_bytes[t]) or vocab.token_bytes[t] in (b'{"', b"{")
                           for t in allowed if vocab.token_bytes[t])
    assert not c.allows(tokenizer.encode("x", add_special_tokens=False)[0])


def test_backend_choice(tokenizer):
    vocab = TokenVocabulary.from_tokenizer(tokenizer)
    assert type(build_constraint(SamplingParams(regex="ab"), vocab)).__name__ == "Constraint"  # auto: the DFA
    assert type(build_constraint(SamplingParams(regex="ab"), vocab, backend="guidance")).__name__ == "GrammarConstraint"
    with pytest.raises(ValueError, match="grammar needs a grammar engine"):
        build_constraint(SamplingParams(grammar=GBNF), vocab, backend="nano")
    with pytest.raises(ValueError, match="backend='xgrammar'"):
        backend_of({"backend": "xgrammar"})
    assert backend_of('{"backend": "nano"}') == "nano" and backend_of(None) == "auto"


def test_guidance_backend_takes_json_schema(qwen2_dir):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6}, "ok": {"type": "boolean"}},
              "required": ["name", "ok"]}
    llm = LLM(str(qwen2_dir), dtype="float32", structured_outputs_config={"backend": "guidance"})
    out = llm.generate(["{"], SamplingParams(temperature=0, max_tokens=40, json_schema=schema))[0].outputs[0]
    assert out.finish_reason == "stop"
    jsonschema.validate(json.loads(out.text), schema)
    assert out.text == json.dumps(json.loads(out.text), ensure_ascii=False)  # the DFA path's layout


@pytest.fixture(scope="module")
def server(qwen2_dir):
    allm = AsyncLLM(str(qwen2_dir), dtype="float32")
    srv = BackgroundServer(allm)
    yield srv
    srv.stop()
    allm.shutdown()


@pytest.mark.parametrize("field", ["structured_outputs", "guided_grammar"])
def test_server_grammar(server, field):
    grammar = {"structured_outputs": {"grammar": GBNF}} if field == "structured_outputs" else {"guided_grammar": GBNF}
    body = {"prompt": PROMPTS[0], "max_tokens": 30, "temperature": 0}
    r = httpx.post(server.url + "/v1/completions", json=body | grammar, timeout=60)
    assert r.status_code == 200, r.text
    assert parses(r.json()["choices"][0]["text"])
    bad = {"structured_outputs": {"grammar": "root ::= ("}} if field == "structured_outputs" else {"guided_grammar": "x"}
    r = httpx.post(server.url + "/v1/completions", json=body | bad, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text


def test_server_structural_tag_in_response_format(server):
    fmt = {"type": "structural_tag", "structures": TAG["structures"], "triggers": TAG["triggers"]}
    body = {"prompt": "<call=w>", "max_tokens": 20, "temperature": 0, "response_format": fmt}
    assert httpx.post(server.url + "/v1/completions", json=body, timeout=60).status_code == 200
    fmt["triggers"] = ["<nope"]
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format", r.text


def test_command_line_backend():
    from nano_infer.cli.arg_utils import EngineArgs, FlexibleArgumentParser
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    for flags, config in ((["--structured-outputs-backend", "nano"], {"backend": "nano"}),
                          (["--structured-outputs-config", '{"backend": "guidance"}'], {"backend": "guidance"}),
                          ([], None)):
        assert EngineArgs.from_cli_args(parser.parse_args(flags)).structured_outputs_config == config
    with pytest.raises(SystemExit):
        parser.parse_args(["--structured-outputs-backend", "xgrammar"])
