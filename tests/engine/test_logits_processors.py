"""vLLM's sampling knobs against their oracles, float32 greedy, token for token: transformers' repetition_penalty,
min_new_tokens, bad_words_ids and sequence_bias; a plain loop of OpenAI's presence/frequency penalty definition;
speculative verification honouring them; bad values refused. logit_bias and allowed_token_ids, applied as one
scatter per request, against a per-row loop over the ids; their tensors made once per request and freed with it."""
import dataclasses
import gc
import weakref

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import nano_infer.sampling_params as sampling_params_module
from nano_infer import LLM, SamplingParams
from nano_infer.engine.logits_processors import Row, apply_logits_rules
from nano_infer.spec import SpeculativeDecoder
from tests.helpers.engine_checks import assert_idle_and_blocks_free
from tests.helpers.model_factory import hf_model
from tests.helpers.parity import prompts

MAX_NEW = 16


@pytest.fixture(scope="module")
def llm(qwen2_dir):
    return LLM(str(qwen2_dir), dtype="float32", block_size=4)


@pytest.fixture(scope="module")
def hf(qwen2_dir):
    return hf_model(qwen2_dir)


@pytest.fixture(scope="module")
def ps(tokenizer):
    return prompts(tokenizer)[:3]


def hf_generate(hf, prompt, eos=None, **knobs):
    """transformers' greedy tokens with exactly the given processors (nothing from a generation config)."""
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW, do_sample=False,
                          eos_token_id=eos, pad_token_id=0, temperature=None, top_k=None, top_p=None, **knobs)
    return out[0, len(prompt):].tolist()


def ours(llm, ps, **knobs):
    params = SamplingParams(max_tokens=MAX_NEW, **{"temperature": 0, "ignore_eos": True, **knobs})
    return [o.outputs[0].token_ids for o in llm.generate(prompt_token_ids=ps, sampling_params=params)]


def test_repetition_penalty_equals_transformers(llm, hf, ps):
    want = [hf_generate(hf, p, repetition_penalty=1.8) for p in ps]
    assert want != [hf_generate(hf, p) for p in ps], "the penalty changes nothing here: no check"
    assert ours(llm, ps, repetition_penalty=1.8) == want
    assert ours(llm, ps, repetition_penalty=0.7) == [hf_generate(hf, p, repetition_penalty=0.7) for p in ps]


def test_logit_bias_equals_sequence_bias(llm, hf, ps):
    plain = [hf_generate(hf, p) for p in ps]
    bias = {plain[0][0]: -100.0, plain[1][2]: -7.5, 17: 3.0}
    want = [hf_generate(hf, p, sequence_bias={(t,): b for t, b in bias.items()}) for p in ps]
    assert want != plain
    assert ours(llm, ps, logit_bias=bias) == want


def test_min_tokens_equals_min_new_tokens(llm, hf, ps):
    """A bias makes EOS the greedy choice at once; min_tokens holds it back for 5 tokens, then it ends the output."""
    eos = llm.engine.hf_config.eos_token_id
    want = [hf_generate(hf, p, eos=eos, min_new_tokens=5, sequence_bias={(eos,): 30.0}) for p in ps]
    assert all(len(w) == 6 and w[-1] == eos for w in want)
    got = ours(llm, ps, ignore_eos=False, min_tokens=5, logit_bias={eos: 30.0})
    assert got == want
    assert [len(t) for t in ours(llm, ps, ignore_eos=False, logit_bias={eos: 30.0})] == [1, 1, 1]


def test_bad_words_equal_bad_words_ids(llm, hf, ps):
    tokenizer = llm.tokenizer  # the engine's, as loaded from the model folder
    plain = [hf_generate(hf, p) for p in ps]
    one = tokenizer.decode(plain[0][1:2])  # a word the first output says
    two = tokenizer.decode(plain[1][3:5])  # a word of two (or more) tokens the second says
    words = [one, two]
    spelled = [tokenizer.encode(s, add_special_tokens=False) for w in words for s in (w.lstrip(), " " + w.lstrip())]
    want = [hf_generate(hf, p, bad_words_ids=spelled) for p in ps]
    assert want != plain and any(len(s) > 1 for s in spelled)
    assert ours(llm, ps, bad_words=words) == want


def openai_penalties_reference(hf, prompt, presence, frequency):
    """OpenAI's definition, step by step: logit[j] -= count[j] * frequency + (count[j] > 0) * presence,
    counting output tokens only, then greedy."""
    tokens = list(prompt)
    with torch.no_grad():
        for _ in range(MAX_NEW):
            logits = hf(torch.tensor([tokens])).logits[0, -1].clone()
            for j in set(tokens[len(prompt):]):
                count = tokens[len(prompt):].count(j)
                logits[j] -= count * frequency + presence
            tokens.append(int(logits.argmax()))
    return tokens[len(prompt):]


@pytest.mark.parametrize("presence,frequency", [(1.5, 0.0), (0.0, 0.9), (0.4, 0.6), (-2.0, 0.0)])
def test_presence_and_frequency_penalties_equal_openai_definition(llm, hf, ps, presence, frequency):
    want = [openai_penalties_reference(hf, p, presence, frequency) for p in ps]
    assert ours(llm, ps, presence_penalty=presence, frequency_penalty=frequency) == want


def test_allowed_token_ids_and_min_p(llm, ps):
    allowed = [5, 9, 40, 41, 300]
    assert all(set(t) <= set(allowed) for t in ours(llm, ps, allowed_token_ids=allowed))
    greedy = ours(llm, ps)
    # min_p=1 keeps only the most likely token: sampling at any temperature is greedy
    assert ours(llm, ps, temperature=1.5, min_p=1.0, seed=3) == greedy
    assert ours(llm, ps, temperature=1.5, min_p=0.0, seed=3) != greedy


def test_rows_with_and_without_rules_share_a_batch(llm, ps):
    """Each row gets its own rules: a penalised request beside plain ones changes only itself."""
    plain, penalised = ours(llm, ps), ours(llm, ps, repetition_penalty=1.8)
    mixed = llm.generate(prompt_token_ids=ps, sampling_params=[
        SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True, repetition_penalty=1.8 if i == 1 else 1.0)
        for i in range(3)])
    assert [o.outputs[0].token_ids for o in mixed] == [plain[0], penalised[1], plain[2]]
    assert_idle_and_blocks_free(llm.engine)


def test_speculative_verification_honours_the_rules(qwen2_dir, hf, ps):
    """The draft (the target itself) proposes without the rules: verification must apply them at each position."""
    spec = LLM(str(qwen2_dir), dtype="float32", block_size=4, speculative_config={
        "method": "draft_model", "model": str(qwen2_dir), "num_speculative_tokens": 3})
    assert ours(spec, ps, repetition_penalty=1.8) == [hf_generate(hf, p, repetition_penalty=1.8) for p in ps]
    want = [openai_penalties_reference(hf, p, 0.0, 0.9) for p in ps]
    assert ours(spec, ps, frequency_penalty=0.9) == want
    stats = spec.engine.plugin(SpeculativeDecoder).stats
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens, "verification accepted all or nothing: not exercised"
    plain = ours(spec, ps)
    rules = dict(logit_bias={plain[0][1]: -100.0, 7: 2.5}, allowed_token_ids=list(range(300)) * 3)
    assert ours(spec, ps, **rules) == ours(LLM(str(qwen2_dir), dtype="float32", block_size=4), ps, **rules) != plain


def test_include_stop_str_in_output(llm, ps, tokenizer):
    text = llm.generate(prompt_token_ids=ps[:1], sampling_params=SamplingParams(
        temperature=0, max_tokens=MAX_NEW, ignore_eos=True))[0].outputs[0].text
    stop = text[3:5]
    cut = text[: text.index(stop)]
    for include, want in ((False, cut), (True, cut + stop)):
        out = llm.generate(prompt_token_ids=ps[:1], sampling_params=SamplingParams(
            temperature=0, max_tokens=MAX_NEW, ignore_eos=True, stop=[stop], include_stop_str_in_output=include))
        assert out[0].outputs[0].text == want


@pytest.mark.parametrize("knobs", [
    dict(repetition_penalty=0), dict(repetition_penalty=float("nan")), dict(presence_penalty=2.5),
    dict(frequency_penalty=-3), dict(min_p=1.5), dict(min_tokens=-1), dict(min_tokens=20, max_tokens=10),
    dict(logit_bias={"a": 1}), dict(logit_bias={1: float("inf")}), dict(bad_words=["  "]), dict(bad_words="abc"),
    dict(allowed_token_ids=[]), dict(allowed_token_ids=[-1]), dict(include_stop_str_in_output="yes"),
    dict(logit_bias={2**70: 1.0}), dict(logit_bias={True: 1.0}), dict(logit_bias={1: 10**400}),
    dict(allowed_token_ids=[2**64]), dict(allowed_token_ids=[1, True]), dict(allowed_token_ids=[1.0])])
def test_bad_values_are_refused_with_the_name(knobs):
    with pytest.raises(ValueError, match=next(k for k in knobs if k != "max_tokens")):
        SamplingParams(**knobs)


def test_token_ids_past_the_vocabulary_are_refused_before_anything_runs(llm, ps):
    vocab = llm.engine.vocab_size
    for knobs in (dict(logit_bias={vocab: 1.0}), dict(allowed_token_ids=[1, vocab + 5])):
        with pytest.raises(ValueError, match="vocabulary"):
            llm.generate(prompt_token_ids=ps, sampling_params=SamplingParams(**knobs))
    assert_idle_and_blocks_free(llm.engine)


def test_logit_bias_is_clamped_to_openai_range():
    assert SamplingParams(logit_bias={3: 500, 4: -1e9}).logit_bias == {3: 100.0, 4: -100.0}


def rules_per_row(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """The rules' meaning, one row and one id at a time: the bias added to the logit (float32), then every id
    not allowed -inf; ids past the logit rows skipped."""
    out = logits.clone()
    for i, p in enumerate(params):
        for t, b in (p.logit_bias or {}).items():
            if t < out.shape[-1]:
                out[i, t] = out[i, t] + torch.tensor(b, dtype=out.dtype)
        if p.allowed_token_ids is not None:
            for t in range(out.shape[-1]):
                if t not in p.allowed_token_ids:
                    out[i, t] = float("-inf")
    return out


VOCAB = 24
token_ids = st.integers(0, VOCAB + 3)  # a few past the logit rows
some_params = st.builds(
    lambda bias, allowed: SamplingParams(logit_bias=bias, allowed_token_ids=allowed),
    st.none() | st.dictionaries(token_ids, st.floats(-150, 150, allow_nan=False), max_size=VOCAB + 4),
    st.none() | st.lists(token_ids, min_size=1, max_size=40))


@settings(max_examples=200, deadline=None)
@given(st.lists(some_params, min_size=1, max_size=4), st.lists(st.integers(0, 3), min_size=1, max_size=8),
       st.integers(0, 2**16))
def test_rules_as_tensors_give_the_per_row_logits(requests, picks, seed):
    """Rows of a few requests, several rows of one request (its samples, a verify's positions) side by side,
    some logits already -inf (a constraint's mask): exactly the per-row loop's logits."""
    params = [requests[k % len(requests)] for k in picks]
    logits = torch.randn(len(params), VOCAB, generator=torch.Generator().manual_seed(seed)) * 10
    logits[logits > 12] = float("-inf")
    got = apply_logits_rules(logits, [Row(p, [1, 2], [3]) for p in params], eos_token_ids={0})
    assert torch.equal(got, rules_per_row(logits, params))


def test_rule_tensors_are_made_once_per_request_and_freed_with_it(llm, ps, monkeypatch):
    """n samples, every step, the server's copy with a cache_salt (dataclasses.replace) and the engine's checks
    share the tensors made when the params were checked; nothing keeps them past the next step (the output
    processor holds the last step's requests until then)."""
    made = []
    build = sampling_params_module.build_token_rules
    monkeypatch.setattr(sampling_params_module, "build_token_rules", lambda *a: made.append(1) or build(*a))
    params = SamplingParams(n=4, temperature=0.8, seed=1, max_tokens=MAX_NEW, ignore_eos=True,
                            logit_bias={t: 1.5 for t in range(0, 400, 3)}, allowed_token_ids=list(range(200)) * 50)
    params = dataclasses.replace(params, cache_salt="tenant")
    out = llm.generate(prompt_token_ids=ps, sampling_params=params)
    assert made == [1] and all(len(o.token_ids) == MAX_NEW and max(o.token_ids) < 200 for r in out for o in r.outputs)
    rules = weakref.ref(params.token_rules)
    del params, out
    ours(llm, ps[:1])
    gc.collect()
    assert rules() is None
    assert_idle_and_blocks_free(llm.engine)


def test_a_rule_field_reassigned_after_construction_is_made_again_and_checked(llm, ps):
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, allowed_token_ids=[5])
    params.allowed_token_ids = [9]
    assert [o.outputs[0].token_ids for o in llm.generate(prompt_token_ids=ps[:1], sampling_params=params)] == [[9] * 4]
    params.logit_bias = {"a": 1}
    with pytest.raises(ValueError, match="logit_bias"):
        llm.generate(prompt_token_ids=ps[:1], sampling_params=params)
    assert_idle_and_blocks_free(llm.engine)
