"""vLLM's offline API as its scripts use it: prompt forms (nano_infer.inputs), get_tokenizer,
get_default_sampling_params, Logprob.decoded_token, cumulative_logprob, and vLLM's engine options."""
import json
import shutil

import pytest

from nano_infer import LLM, SamplingParams
from nano_infer.inputs import TextPrompt, TokensPrompt
from tests.helpers.engine_checks import assert_idle_and_blocks_free

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
TEXT = "To be, or not to be, that is the question"


@pytest.fixture(scope="module")
def llm(qwen2_dir):
    return LLM(str(qwen2_dir), dtype="float32", block_size=4)


def tokens(outs):
    return [o.outputs[0].token_ids for o in outs]


def test_every_prompt_form_gives_the_same_tokens(llm):
    ids = llm.get_tokenizer().encode(TEXT, add_special_tokens=False)
    want = tokens(llm.generate(TEXT, GREEDY))
    assert tokens(llm.generate(TextPrompt(prompt=TEXT), GREEDY)) == want
    assert tokens(llm.generate({"prompt_token_ids": ids}, GREEDY)) == want
    mixed = llm.generate([TEXT, TokensPrompt(prompt_token_ids=ids), {"prompt": TEXT}], GREEDY)
    assert tokens(mixed) == want * 3
    assert [o.prompt_token_ids for o in mixed] == [ids] * 3
    assert [o.prompt for o in mixed] == [TEXT, None, TEXT]
    assert llm.generate(TokensPrompt(prompt_token_ids=ids, prompt="shown"), GREEDY)[0].prompt == "shown"
    assert tokens(llm.generate(prompt_token_ids=ids, sampling_params=GREEDY)) == want  # the older keyword


def test_a_prompts_cache_salt_keeps_it_from_others_cached_blocks(llm):
    ids = llm.get_tokenizer().encode(TEXT * 3, add_special_tokens=False)
    llm.generate(TokensPrompt(prompt_token_ids=ids), GREEDY)
    salted, plain = llm.generate([TokensPrompt(prompt_token_ids=ids, cache_salt="tenant-b"),
                                  TokensPrompt(prompt_token_ids=ids)], GREEDY)
    assert salted.num_cached_tokens == 0 and plain.num_cached_tokens > 0
    assert tokens([salted]) == tokens([plain])


@pytest.mark.parametrize("prompt,match", [
    ({"prompt": TEXT, "multi_modal_data": {}}, "multi_modal_data"), ({}, "prompt_token_ids"), (42, "int"),
    ([{"prompt_token_ids": [1, 2]}, {"token_ids": [1]}], "token_ids")])
def test_bad_prompt_forms_raise_before_anything_runs(llm, prompt, match):
    with pytest.raises(ValueError, match=match):
        llm.generate(prompt, GREEDY)
    assert_idle_and_blocks_free(llm.engine)


def test_default_sampling_params_come_from_generation_config(qwen2_dir, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(qwen2_dir, folder)
    (folder / "generation_config.json").write_text(json.dumps(
        {"do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05,
         "max_new_tokens": 9}))
    llm = LLM(str(folder), dtype="float32")
    p = llm.get_default_sampling_params()
    assert (p.temperature, p.top_p, p.top_k, p.repetition_penalty, p.max_tokens) == (0.7, 0.8, 20, 1.05, 9)
    out = llm.generate(TEXT)[0].outputs[0]  # no sampling_params: the model's defaults
    assert len(out.token_ids) == 9 or out.finish_reason == "stop"


def test_logprobs_carry_decoded_tokens_and_a_cumulative_logprob(llm):
    tok = llm.get_tokenizer()
    outs = llm.generate(TEXT, SamplingParams(n=2, temperature=1.0, seed=5, max_tokens=6, ignore_eos=True, logprobs=3,
                                             prompt_logprobs=1))
    for c in outs[0].outputs:
        assert c.cumulative_logprob == pytest.approx(sum(e[t].logprob for e, t in zip(c.logprobs, c.token_ids)))
        for entry in c.logprobs:
            assert all(lp.decoded_token == tok.decode([t]) for t, lp in entry.items())
    assert all(lp.decoded_token == tok.decode([t]) for e in outs[0].prompt_logprobs[1:] for t, lp in e.items())
    assert llm.generate(TEXT, GREEDY)[0].outputs[0].cumulative_logprob is None  # not computed when not asked


def test_vllm_engine_options(qwen2_dir, caplog):
    with caplog.at_level("INFO", logger="nano_infer.config"):
        llm = LLM(str(qwen2_dir), dtype="float32", seed=0, enforce_eager=True, trust_remote_code=True,
                  enable_prefix_caching=False, disable_log_stats=True, tokenizer=str(qwen2_dir))
    assert llm.engine.prefix_cache is None and "trust_remote_code" in caplog.text
    sampled = SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True)  # no per-request seed
    first = tokens(llm.generate([TEXT] * 3, sampled))
    again = LLM(str(qwen2_dir), dtype="float32", seed=0)
    assert tokens(again.generate([TEXT] * 3, sampled)) == first  # the engine's seed made the draws repeat
    assert LLM(str(qwen2_dir), dtype="float32", enable_prefix_caching=True).engine.prefix_cache is not None
    with pytest.raises(ValueError, match="enable_prefix_caching"):
        LLM(str(qwen2_dir), kv_cache="contiguous", enable_prefix_caching=True)
    with pytest.raises(TypeError, match="unknown engine option"):
        LLM(str(qwen2_dir), enable_everything=True)


def test_beam_search_params_import_from_where_vllm_has_them():
    from nano_infer.beam import BeamSearchParams as from_beam
    from nano_infer.sampling_params import BeamSearchParams

    assert BeamSearchParams is from_beam
