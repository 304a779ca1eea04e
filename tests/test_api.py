"""The vLLM-style API: sampling options, n > 1, stop conditions, abort, and clear errors on bad input."""
import pytest
import torch

from nano_infer import LLM, LLMEngine, SamplingParams
from nano_infer.engine.sampling import apply_top_k_top_p


@pytest.fixture(scope="module")
def llm(qwen2_dir):
    return LLM(str(qwen2_dir), dtype="float32", block_size=4)


def assert_clean(engine):
    if engine.prefix_cache is not None:
        engine.kv.clear()
    assert engine.kv.num_free_blocks == engine.kv.num_blocks
    assert not engine.requests and not engine.scheduler.running and not engine.scheduler.waiting


@pytest.mark.parametrize("field,value,allowed", [
    ("max_tokens", 0, ">= 1"), ("max_tokens", -3, ">= 1"), ("temperature", -0.5, ">= 0"),
    ("top_p", 0.0, "(0, 1]"), ("top_p", 1.5, "(0, 1]"), ("top_k", -2, "-1"), ("n", 0, ">= 1"),
    ("temperature", float("inf"), "finite"), ("temperature", float("nan"), "finite"), ("top_p", float("nan"), "(0, 1]"),
    ("seed", 2**70, "64-bit"), ("seed", 1.5, "64-bit"), ("max_tokens", True, ">= 1"), ("top_k", True, "-1"), ("top_k", 2**70, "2147483647"),
    ("n", True, ">= 1"), ("stop", ["x"] * 33, "at most 32"), ("stop", ["x" * 1025], "at most 1024"),
    ("logprobs", 21, "[0, 20]"), ("logprobs", -1, "[0, 20]"), ("prompt_logprobs", 21, "[0, 20]"),
    ("prompt_logprobs", True, "[0, 20]"),
])
def test_bad_sampling_params_name_field_and_range(field, value, allowed):
    with pytest.raises(ValueError) as e:
        SamplingParams(**{field: value})
    assert field in str(e.value) and allowed in str(e.value)


def test_bad_requests_raise_and_leave_engine_usable(llm, tokenizer):
    with pytest.raises(ValueError, match="non-empty"):
        llm.generate([""])
    with pytest.raises(ValueError, match="at least one token"):
        llm.generate(prompt_token_ids=[[]])
    with pytest.raises(ValueError, match=r"\[0, "):
        llm.generate(prompt_token_ids=[[1, 10**6]])
    with pytest.raises(ValueError, match="max_model_len"):  # a prompt that leaves no room (max_tokens is capped, as vLLM)
        llm.generate(prompt_token_ids=[[5] * 600], sampling_params=SamplingParams(max_tokens=1))
    # a bad request in a batch rejects the batch and leaves nothing queued
    with pytest.raises(ValueError):
        llm.generate(["fine prompt", ""])
    assert_clean(llm.engine)
    out = llm.generate(["To be"], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 5


def test_unknown_model_path_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="neither a local folder nor a hub id"):
        LLM(str(tmp_path / "no" / "such" / "model"))
    with pytest.raises(ValueError, match="could not fetch model"):
        LLM("nobody/does-not-exist")  # offline in tests: must fail fast, naming the offline default


def test_unknown_engine_option_is_rejected(qwen2_dir):
    with pytest.raises(TypeError, match="kv_cahce"):
        LLM(str(qwen2_dir), kv_cahce="paged")
    with pytest.raises(ValueError, match="kv_cache"):
        LLM(str(qwen2_dir), kv_cache="ring")
    with pytest.raises(ValueError, match="needs kv_cache='paged'"):
        LLM(str(qwen2_dir), kv_cache="contiguous", prefix_cache="radix")


def test_request_that_can_never_fit_is_rejected_and_one_that_can_waits(qwen2_dir):
    llm = LLM(str(qwen2_dir), dtype="float32", block_size=4, num_kv_blocks=8, prefix_cache=None)
    with pytest.raises(ValueError, match="could never fit"):
        llm.generate(prompt_token_ids=[[5] * 10], sampling_params=SamplingParams(max_tokens=40))
    # each fits alone (7 blocks), not together: the second waits, both finish
    params = SamplingParams(temperature=0, max_tokens=18, ignore_eos=True)
    outs = llm.generate(prompt_token_ids=[[5] * 10, [6] * 10], sampling_params=params)
    assert [len(o.outputs[0].token_ids) for o in outs] == [18, 18]
    assert_clean(llm.engine)


def test_seed_makes_sampling_reproducible_whatever_the_batch(llm):
    p = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=16, seed=7, ignore_eos=True)
    alone = llm.generate(["To be, or not"], p)[0].outputs[0].token_ids
    other = SamplingParams(temperature=0.8, max_tokens=20, ignore_eos=True)
    batched = llm.generate(["The quick", "To be, or not", "def f"], [other, p, other])[1].outputs[0].token_ids
    assert alone == batched
    different = llm.generate(["To be, or not"], SamplingParams(temperature=1.0, top_p=0.9, max_tokens=16, seed=8, ignore_eos=True))
    assert different[0].outputs[0].token_ids != alone


def test_top_k_top_p_keep_the_right_tokens():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.25, 0.25, 0.25, 0.25]]))
    out = apply_top_k_top_p(logits.clone(), torch.tensor([-1, 2]), torch.tensor([0.7, 1.0]))
    assert torch.isfinite(out).tolist() == [[True, True, False, False], [True, True, False, False]]
    out = apply_top_k_top_p(logits.clone(), torch.tensor([1, -1]), torch.tensor([1.0, 0.01]))
    assert torch.isfinite(out).sum(1).tolist() == [1, 1]  # the top token always survives


def test_n_samples_share_prompt_blocks(qwen2_dir, tokenizer):
    prompt = tokenizer.encode("To be, or not to be, that is the question: whether 'tis nobler in the mind")
    params = SamplingParams(n=4, temperature=1.0, max_tokens=6, seed=3, ignore_eos=True)
    llm = LLM(str(qwen2_dir), dtype="float32", block_size=4, prefix_cache=None, record_steps=True)
    out = llm.generate(prompt_token_ids=[prompt], sampling_params=params)[0]
    assert [c.index for c in out.outputs] == [0, 1, 2, 3]
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1, "samples should differ"
    peak_shared = max(llm.engine.kv.num_blocks - r.num_free_blocks for r in llm.engine.history)
    solo = LLM(str(qwen2_dir), dtype="float32", block_size=4, prefix_cache=None, record_steps=True)
    solo.generate(prompt_token_ids=[prompt] * 4, sampling_params=SamplingParams(temperature=1.0, max_tokens=6, ignore_eos=True))
    peak_independent = max(solo.engine.kv.num_blocks - r.num_free_blocks for r in solo.engine.history)
    blocks_per_prompt = -(-len(prompt) // 4)
    assert peak_independent >= 4 * blocks_per_prompt
    assert peak_shared < peak_independent
    # greedy samples of one prompt are all the greedy output
    greedy = llm.generate(prompt_token_ids=[prompt], sampling_params=SamplingParams(n=3, temperature=0, max_tokens=8, ignore_eos=True))[0]
    assert len({tuple(c.token_ids) for c in greedy.outputs}) == 1
    assert_clean(llm.engine)


def test_forked_samples_count_against_max_num_seqs(qwen2_dir, tokenizer):
    """A request with n samples takes n seats from admission on: its forks never push the running batch past
    max_num_seqs, and n > max_num_seqs is refused up front."""
    llm = LLM(str(qwen2_dir), dtype="float32", block_size=4, max_num_seqs=3)
    engine = llm.engine
    with pytest.raises(ValueError, match="n=4 samples run side by side, but max_num_seqs=3"):
        engine.add_request("too-many", "To be", SamplingParams(n=4))
    assert not engine.has_unfinished_requests()
    params = [SamplingParams(n=n, temperature=1.0, seed=i, max_tokens=5, ignore_eos=True) for i, n in enumerate([2, 3, 1, 2, 1])]
    for i, p in enumerate(params):
        engine.add_request(f"r{i}", f"To be, or not to be {i}", p)
    finished, peak = {}, 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
        peak = max(peak, len(engine.scheduler.running))
        assert len(engine.scheduler.running) <= 3
    assert peak == 3
    assert {r: len(o.outputs) for r, o in finished.items()} == {f"r{i}": p.n for i, p in enumerate(params)}
    assert all(len(c.token_ids) == 5 for o in finished.values() for c in o.outputs)
    assert_clean(engine)


def test_stop_strings_and_stop_token_ids(llm):
    base = llm.generate(["To be, or not"], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))[0].outputs[0]
    text = base.text
    assert len(text) > 4
    stop = text[2:4]
    cut = llm.generate(["To be, or not"], SamplingParams(temperature=0, max_tokens=20, stop=[stop], ignore_eos=True))[0].outputs[0]
    assert cut.finish_reason == "stop" and cut.stop_reason == stop
    assert cut.text == text[: text.find(stop)]
    tok = base.token_ids[3]
    cut = llm.generate(["To be, or not"], SamplingParams(temperature=0, max_tokens=20, stop_token_ids=[tok], ignore_eos=True))[0].outputs[0]
    assert cut.token_ids == base.token_ids[: base.token_ids.index(tok) + 1] and cut.stop_reason == tok
    assert base.finish_reason == "length"


def test_eos_ends_the_request_unless_ignored(qwen2_dir):
    engine = LLMEngine(str(qwen2_dir), dtype="float32")
    ref = LLM(str(qwen2_dir), dtype="float32").generate(prompt_token_ids=[[7, 8, 9]], sampling_params=SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))[0].outputs[0].token_ids
    engine.eos_token_ids.clear()  # pretend the 6th greedy token is EOS (the set the output processor reads)
    engine.eos_token_ids.add(ref[5])
    engine.add_request("r", prompt_token_ids=[7, 8, 9], params=SamplingParams(temperature=0, max_tokens=30))
    while engine.has_unfinished_requests():
        outs = engine.step()
    assert outs[0].outputs[0].token_ids == ref[: ref.index(ref[5]) + 1]
    assert outs[0].outputs[0].finish_reason == "stop"


def test_abort_frees_blocks_and_other_requests_continue(llm):
    engine = llm.engine
    p = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    engine.add_request("a", "To be, or not to be", p)
    engine.add_request("b", "The quick brown fox", p)
    for _ in range(3):
        engine.step()
    aborted = engine.abort_request("a")
    assert aborted.outputs[0].finish_reason == "abort" and aborted.finished
    assert engine.abort_request("a") is None
    finished = []
    while engine.has_unfinished_requests():
        finished += [o for o in engine.step() if o.finished]
    assert [o.request_id for o in finished] == ["b"] and len(finished[0].outputs[0].token_ids) == 30
    assert_clean(engine)


def test_chat_applies_the_template(llm):
    messages = [{"role": "user", "content": "Hi"}]
    out = llm.chat(messages, SamplingParams(temperature=0, max_tokens=4))[0]
    expected = llm.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    expected = expected["input_ids"] if hasattr(expected, "keys") else expected
    assert out.prompt_token_ids == list(expected)
    with pytest.raises(ValueError, match="messages"):
        llm.chat([{"content": "no role"}])


def test_cli_generate_streams_text(qwen2_dir, capsys):
    from nano_infer.cli.main import main

    assert main(["generate", "To be, or not", "--model", str(qwen2_dir), "--max-tokens", "8", "--ignore-eos"]) == 0
    printed = capsys.readouterr().out
    expected = LLM(str(qwen2_dir), dtype="float32").generate(["To be, or not"], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert printed == expected[0].outputs[0].text + "\n"
    assert main(["generate", "x", "--model", str(qwen2_dir), "--max-tokens", "0"]) == 2
    assert "max_tokens" in capsys.readouterr().err
