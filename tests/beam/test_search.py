"""Beam search (chapter 11): the same beams, in the same order, as transformers, in every engine configuration.

Random models rarely emit their EOS token, so `eosy_dir` is the qwen2 model with its
generation_config.json naming the four tokens transformers' greedy output uses most as EOS:
there beams end early and the early-stopping rules decide the result.
"""
import collections
import json
import shutil

import pytest
import torch

from nano_infer import LLM, LLMEngine, SamplingParams
from nano_infer.beam import BeamSearchParams
from tests.helpers.beam_reference import hf_beams
from tests.helpers.model_factory import hf_model

PROMPTS = ["To be, or not to be", "The quick brown fox", '{"name": "Ada", "age"', "café naïve 0123"]


@pytest.fixture(scope="module")
def eosy_dir(qwen2_dir, tmp_path_factory, tokenizer):
    folder = tmp_path_factory.mktemp("eosy") / "m"
    shutil.copytree(qwen2_dir, folder)
    hf = hf_model(folder)
    counts = collections.Counter()
    for p in PROMPTS:
        ids = torch.tensor([tokenizer.encode(p)])
        with torch.no_grad():
            out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=30, do_sample=False,
                              eos_token_id=None, pad_token_id=tokenizer.pad_token_id)
        counts.update(out[0, ids.shape[1]:].tolist())
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [t for t, _ in counts.most_common(4)]}))
    return folder


@pytest.fixture(scope="module")
def eosy(eosy_dir):
    return LLM(str(eosy_dir), dtype="float32", block_size=4), hf_model(eosy_dir)


def check(llm, hf, params, prompts=PROMPTS, tokenizer=None):
    """nano_infer's hypotheses equal transformers' (tokens and order; scores to float32 noise); returns the outputs."""
    tok = tokenizer or llm.tokenizer
    outs = llm.beam_search([{"prompt_token_ids": tok.encode(p)} for p in prompts], params)
    for p, out in zip(prompts, outs):
        ids = tok.encode(p)
        ref, scores = hf_beams(hf, ids, params, llm.engine.eos_token_ids, tok.pad_token_id)
        assert [s.tokens for s in out.sequences] == ref, (p, params)
        if params.beam_width > 1:
            assert [s.score for s in out.sequences] == pytest.approx(scores, abs=1e-3)
    return outs


def beam_tokens(out) -> list[list[int]]:
    return [list(out.prompt_token_ids) + c.token_ids for c in out.outputs]


def assert_all_free(engine):
    if engine.prefix_cache is not None:
        engine.kv.clear()
    assert engine.kv.num_free_blocks == engine.kv.num_blocks, "KV blocks leaked"
    assert all(r == 0 for r in engine.kv.ref_count)
    assert not engine.requests and not engine.scheduler.running and not engine.scheduler.waiting


# -- the oracle ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("width", [2, 4])
def test_beams_match_transformers_for_each_family(model_dir, tokenizer, width):
    llm, hf = LLM(str(model_dir), dtype="float32", block_size=4), hf_model(model_dir)
    for length_penalty in (0.0, 1.0, 2.0):
        for early_stopping in (False, True, "never"):
            check(llm, hf, BeamSearchParams(width, 12, length_penalty=length_penalty, early_stopping=early_stopping),
                  PROMPTS[:2])
    assert_all_free(llm.engine)


@pytest.mark.parametrize("width", range(1, 9))
def test_beams_match_transformers_when_eos_ends_beams(eosy, width):
    llm, hf = eosy
    reasons = collections.Counter()
    for length_penalty in (0.0, 1.0, 2.0):
        for early_stopping in (False, True, "never"):
            outs = check(llm, hf, BeamSearchParams(width, 16, length_penalty=length_penalty,
                                                   early_stopping=early_stopping))
            reasons.update(s.finish_reason for o in outs for s in o.sequences)
    assert reasons["stop"] > 0 and reasons["length"] > 0  # EOS ended some hypotheses, the limit others
    assert_all_free(llm.engine)


def test_width_one_is_greedy(eosy):
    llm, hf = eosy
    beams = check(llm, hf, BeamSearchParams(1, 20))
    greedy = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=20))
    assert [o.sequences[0].output_tokens for o in beams] == [g.outputs[0].token_ids for g in greedy]


def test_temperature_and_ignore_eos(eosy):
    llm, hf = eosy
    check(llm, hf, BeamSearchParams(3, 12, temperature=0.7))
    outs = check(llm, hf, BeamSearchParams(3, 12, ignore_eos=True))
    assert all(len(s.output_tokens) == 12 and s.finish_reason == "length" for o in outs for s in o.sequences)


def test_max_tokens_none_runs_to_the_model_length(eosy_dir, eosy):
    _, hf = eosy
    llm = LLM(str(eosy_dir), dtype="float32", block_size=4, max_model_len=24)
    ids = llm.tokenizer.encode(PROMPTS[0])
    out = llm.beam_search({"prompt_token_ids": ids}, BeamSearchParams(3, None, ignore_eos=True))[0]
    ref, _ = hf_beams(hf, ids, BeamSearchParams(3, 24 - len(ids), ignore_eos=True), (), llm.tokenizer.pad_token_id)
    assert [s.tokens for s in out.sequences] == ref and all(len(s.tokens) == 24 for s in out.sequences)


def test_outputs_carry_text_scores_and_prompt(eosy):
    llm, _ = eosy
    params = BeamSearchParams(3, 16, length_penalty=1.0)
    out = llm.beam_search("To be, or not to be", params)[0]
    prompt = llm.tokenizer.encode("To be, or not to be")
    assert len(out.sequences) == 3
    scores = [s.score for s in out.sequences]
    assert scores == sorted(scores, reverse=True)
    for s in out.sequences:
        assert s.tokens[: len(prompt)] == prompt and s.output_tokens == s.tokens[len(prompt):]
        assert s.score == pytest.approx(s.cum_logprob / len(s.output_tokens), rel=1e-5)
        assert s.text == llm.tokenizer.decode(s.output_tokens, skip_special_tokens=True)
    stopped = [s for o in llm.beam_search(PROMPTS, params) for s in o.sequences if s.finish_reason == "stop"]
    assert stopped and all(s.output_tokens[-1] in llm.engine.eos_token_ids for s in stopped)
    with_stop = llm.beam_search(PROMPTS, BeamSearchParams(3, 16, include_stop_str_in_output=True))
    ended = [s for o in with_stop for s in o.sequences if s.finish_reason == "stop"]
    assert ended and all(s.text.endswith(llm.tokenizer.decode(s.output_tokens[-1:])) for s in ended)


# -- inside the engine -------------------------------------------------------------------------------------------
CONFIGS = [
    dict(kv_cache="none"),
    dict(block_size=1, prefix_cache=None),
    dict(block_size=7, prefix_cache="hash"),
    dict(block_size=4, prefix_cache="radix", attention="blockwise"),
    dict(block_size=3, prefix_cache=None, attention="blockwise"),
    dict(block_size=4, max_num_batched_tokens=5),  # beams split across steps: some wait for their siblings
    dict(block_size=4, max_num_seqs=4, max_num_batched_tokens=3, enable_chunked_prefill=True),
    dict(block_size=2, num_kv_blocks=40, prefix_cache=None),  # preemption, recomputed without a cache
    dict(block_size=2, num_kv_blocks=40, prefix_cache="radix"),  # preemption, shared prefix found again
    dict(block_size=2, num_kv_blocks=40, prefix_cache="hash"),
    dict(scheduler="static", max_num_seqs=8, block_size=4),
    dict(scheduler_policy="lpm", prefix_cache="radix", block_size=4),
]


@pytest.fixture(scope="module")
def eosy_reference(eosy_dir, eosy):
    llm, hf = eosy
    params = BeamSearchParams(4, 14)
    refs = [hf_beams(hf, llm.tokenizer.encode(p), params, llm.engine.eos_token_ids, llm.tokenizer.pad_token_id)[0]
            for p in PROMPTS]
    return params, refs


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_beams_identical_in_every_configuration(config, eosy_dir, eosy_reference):
    params, refs = eosy_reference
    llm = LLM(str(eosy_dir), dtype="float32", **config)
    first = llm.beam_search(PROMPTS, params)
    second = llm.beam_search(PROMPTS, params)  # with a prefix cache: the prompts hit now
    assert [[s.tokens for s in o.sequences] for o in first] == refs
    assert [[s.tokens for s in o.sequences] for o in second] == refs
    if llm.engine.kv is not None:
        assert_all_free(llm.engine)


def test_preempted_beams_recompute(eosy_dir, eosy):
    _, hf = eosy
    params = BeamSearchParams(4, 14, ignore_eos=True)  # every beam runs to the limit: the pool runs out
    engine = LLMEngine(str(eosy_dir), dtype="float32", block_size=2, num_kv_blocks=40, prefix_cache=None)
    refs = [hf_beams(hf, engine.tokenizer.encode(p), params, (), engine.tokenizer.pad_token_id)[0] for p in PROMPTS]
    for i, p in enumerate(PROMPTS):
        engine.add_request(str(i), p, params)
    outs = {}
    while engine.has_unfinished_requests():
        outs.update((o.request_id, o) for o in engine.step() if o.finished)
    assert sum(o.metrics.num_preemptions for o in outs.values()) > 0
    assert [beam_tokens(outs[str(i)]) for i in range(4)] == refs
    assert_all_free(engine)


def test_beams_batch_with_ordinary_requests(eosy_dir, eosy_reference):
    params, refs = eosy_reference
    greedy = SamplingParams(temperature=0, max_tokens=10)
    alone = LLM(str(eosy_dir), dtype="float32", block_size=4).generate(PROMPTS, greedy)
    engine = LLMEngine(str(eosy_dir), dtype="float32", block_size=4, record_steps=True)
    for i, p in enumerate(PROMPTS):
        engine.add_request(f"beam{i}", p, params)
        engine.add_request(f"greedy{i}", p, greedy)
    outs = {}
    while engine.has_unfinished_requests():
        outs.update((o.request_id, o) for o in engine.step() if o.finished)
    assert [beam_tokens(outs[f"beam{i}"]) for i in range(4)] == refs
    assert [outs[f"greedy{i}"].outputs[0].token_ids for i in range(4)] == [a.outputs[0].token_ids for a in alone]
    kinds = [{rid.rstrip("0123456789") for rid, *_ in rec.scheduled} for rec in engine.history]
    assert any(k == {"beam", "greedy"} for k in kinds)  # one forward pass carried both
    assert_all_free(engine)


def test_prompt_is_prefilled_once_and_beams_fork_copy_and_free(eosy_dir):
    engine = LLMEngine(str(eosy_dir), dtype="float32", block_size=4, prefix_cache=None, record_steps=True)
    engine.kv.blocks.log = []
    prompt = engine.tokenizer.encode(PROMPTS[0])
    engine.add_request("r", prompt_token_ids=prompt, params=BeamSearchParams(4, 14))
    prefill_tokens, peak_shared = 0, 0
    while engine.has_unfinished_requests():
        engine.step()
        rec = engine.history[-1]
        prefill_tokens += sum(n for *_, n, kind in rec.scheduled if kind == "prefill")
        peak_shared = max(peak_shared, max(engine.kv.ref_count))
    assert prefill_tokens == len(prompt)  # the prompt's K/V is computed once, for all beams
    ops = collections.Counter(e.op for e in engine.kv.blocks.log)
    assert ops["share"] > 0 and ops["cow"] > 0 and ops["free"] > 0
    assert peak_shared == 4  # the prompt's blocks were read by all four beams
    assert_all_free(engine)


def test_abort_frees_every_beam(eosy_dir):
    engine = LLMEngine(str(eosy_dir), dtype="float32", block_size=4, prefix_cache="radix")
    engine.add_request("r", PROMPTS[0], BeamSearchParams(6, 30, ignore_eos=True))
    for _ in range(8):
        engine.step()
    assert len(engine.requests["r"].seqs) == 6 and max(engine.kv.ref_count) > 1
    out = engine.abort_request("r")
    assert out.finished
    assert_all_free(engine)


def test_a_failing_round_fails_its_request_alone(eosy_dir, monkeypatch):
    from nano_infer.beam import BeamState

    engine = LLMEngine(str(eosy_dir), dtype="float32", block_size=4)
    engine.add_request("bad", PROMPTS[0], BeamSearchParams(3, 10))
    engine.add_request("good", PROMPTS[1], BeamSearchParams(3, 10))
    select = BeamState.select

    def failing(state):
        if state.beams[0].seq.request_id == "bad" and state.num_generated == 2:
            raise RuntimeError("planted")
        return select(state)

    monkeypatch.setattr(BeamState, "select", failing)
    outs = {}
    while engine.has_unfinished_requests():
        outs.update((o.request_id, o) for o in engine.step() if o.finished)
    assert isinstance(outs["bad"].error, RuntimeError) and outs["good"].error is None
    assert len(outs["good"].outputs) == 3
    assert_all_free(engine)


# -- bad input ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, field", [
    (dict(beam_width=0, max_tokens=4), "beam_width"),
    (dict(beam_width=2.0, max_tokens=4), "beam_width"),
    (dict(beam_width=2, max_tokens=0), "max_tokens"),
    (dict(beam_width=2, max_tokens=4, temperature=-1), "temperature"),
    (dict(beam_width=2, max_tokens=4, length_penalty=float("nan")), "length_penalty"),
    (dict(beam_width=2, max_tokens=4, early_stopping="sometimes"), "early_stopping"),
    (dict(beam_width=2, max_tokens=4, ignore_eos="yes"), "ignore_eos"),
])
def test_bad_params_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        BeamSearchParams(**kwargs)


def test_bad_requests_are_refused_before_anything_runs(eosy_dir):
    llm = LLM(str(eosy_dir), dtype="float32", block_size=4, max_num_seqs=4, num_kv_blocks=20)
    with pytest.raises(ValueError, match="beam_width=5 beams run side by side, but max_num_seqs=4"):
        llm.beam_search(PROMPTS[0], BeamSearchParams(5, 4))
    with pytest.raises(ValueError, match="KV blocks but the pool has 20"):
        llm.beam_search(PROMPTS[0], BeamSearchParams(4, 30))
    with pytest.raises(ValueError, match="prompt must be"):
        llm.beam_search([{"text": "x"}], BeamSearchParams(2, 4))
    with pytest.raises(ValueError, match="BeamSearchParams"):
        llm.beam_search(PROMPTS[0], SamplingParams())
    assert_all_free(llm.engine)
    with pytest.raises(ValueError, match="kv_cache='paged'"):
        LLM(str(eosy_dir), dtype="float32", kv_cache="contiguous").beam_search(PROMPTS[0], BeamSearchParams(2, 4))
    spec = LLM(str(eosy_dir), dtype="float32", speculative_config={"method": "ngram", "num_speculative_tokens": 2})
    with pytest.raises(ValueError, match="speculative decoding"):
        spec.beam_search(PROMPTS[0], BeamSearchParams(2, 4))


# -- real checkpoints: chats, where the end-of-turn token ends beams -------------------------------------------------
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Answer in one short sentence."}, {"role": "user", "content": "Why is the sky blue?"}],
]


def check_chats(llm, hf, chats, params):
    prompts = [llm.apply_chat_template(c) for c in chats]
    outs = llm.beam_search([{"prompt_token_ids": p} for p in prompts], params)
    for ids, out in zip(prompts, outs):
        ref, scores = hf_beams(hf, ids, params, llm.engine.eos_token_ids, llm.tokenizer.pad_token_id)
        assert [s.tokens for s in out.sequences] == ref
        assert [s.score for s in out.sequences] == pytest.approx(scores, abs=1e-3)
    return outs


def test_shipped_chat_model_beams_match_transformers():
    from tests.helpers.checkpoints import MESSAGES, TINY
    from transformers import AutoModelForCausalLM

    llm = LLM(str(TINY), dtype="float32", block_size=8)
    hf = AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32, attn_implementation="sdpa").eval()
    chats = [MESSAGES, [{"role": "system", "content": "You are JULIET in Romeo and Juliet. Stay in character."},
                        {"role": "user", "content": "ROMEO: Lady, by yonder blessed moon I swear."}]]
    ended = 0
    for width, early_stopping in ((2, False), (4, True), (3, "never")):
        outs = check_chats(llm, hf, chats, BeamSearchParams(width, 40, early_stopping=early_stopping))
        ended += sum(s.finish_reason == "stop" for o in outs for s in o.sequences)
    assert ended > 0  # some hypotheses ended their turn before the limit
    assert_all_free(llm.engine)


@pytest.mark.slow
def test_gguf_smollm2_beams_match_transformers():
    from tests.helpers.checkpoints import GGUF, transformers_gguf

    if not GGUF.is_file():
        pytest.fail(f"{GGUF} is absent: `make models` fetches it (make test does)")
    llm = LLM(str(GGUF), dtype="float32", block_size=8)
    hf = transformers_gguf()
    outs = check_chats(llm, hf, CHATS, BeamSearchParams(3, 48, length_penalty=1.0))
    assert any(s.finish_reason == "stop" for o in outs for s in o.sequences)
    assert_all_free(llm.engine)
