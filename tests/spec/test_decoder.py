"""Speculative decoding: greedy output token-identical to plain decoding (and to transformers),
for both proposers across the engine's configurations; the KV pool and prefix cache left
clean; bad configurations refused."""
import json
import shutil
import statistics

import pytest

from nano_infer import LLM, SamplingParams
from nano_infer.models.loader import TINY_MODEL_DIR
from nano_infer.spec import SpeculativeDecoder
from tests.helpers.engine_checks import assert_idle_and_blocks_free
from tests.helpers.model_factory import make_model_dir
from tests.helpers.parity import GREEDY, prompts, reference

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}


@pytest.fixture(scope="module")
def ref(qwen2_dir, tokenizer):
    ps = prompts(tokenizer)
    return ps, reference(qwen2_dir, ps)


@pytest.fixture(scope="module")
def other_draft(tmp_path_factory, tokenizer):
    """A random model of another family with the target's tokenizer: most proposals are rejected."""
    return make_model_dir("llama", tmp_path_factory.mktemp("draft"), tokenizer, seed=3)


def spec_configs(qwen2_dir, other_draft):
    return {
        "ngram": NGRAM,
        "draft=target": {"method": "draft_model", "model": str(qwen2_dir), "num_speculative_tokens": 4},
        "draft=random": {"method": "draft_model", "model": str(other_draft), "num_speculative_tokens": 2},
    }


# each engine configuration of the parity CONFIGS that keeps a KV cache, with the proposer that exercises it
# most (the random draft rejects nearly everything: rollback on every step)
CASES = [
    (dict(kv_cache="contiguous"), "ngram"),
    (dict(kv_cache="contiguous"), "draft=random"),
    (dict(kv_cache="paged", block_size=1, prefix_cache=None), "draft=target"),
    (dict(block_size=7, prefix_cache="hash"), "ngram"),
    (dict(block_size=7, prefix_cache="hash"), "draft=random"),
    (dict(block_size=4, prefix_cache="radix", attention="blockwise"), "draft=target"),
    (dict(block_size=3, prefix_cache="hash", attention="blockwise"), "draft=random"),
    (dict(block_size=4, max_num_batched_tokens=8), "ngram"),  # chunked prefill, mixed steps, budget cuts k
    (dict(block_size=4, max_num_batched_tokens=8), "draft=random"),
    (dict(block_size=4, num_kv_blocks=16, prefix_cache="radix"), "draft=target"),  # preemption + eviction
    (dict(block_size=4, num_kv_blocks=16, prefix_cache="hash"), "draft=random"),
    (dict(scheduler="static", max_num_seqs=2), "ngram"),
    (dict(scheduler_policy="lpm", prefix_cache="radix", block_size=4), "draft=random"),
]


def check_blocks(engine) -> None:
    """After every step: reference counts equal block-table references (plus the prefix cache's
    one on each block it keeps), and every running sequence holds exactly the blocks of its
    computed tokens (rejected proposals' blocks went back)."""
    if engine.config.kv_cache != "paged":
        return
    kv, bs = engine.kv, engine.kv.block_size
    holders = [int(kv.holds(b)) for b in range(kv.num_blocks)]
    for seq in engine.scheduler.running:
        assert len(seq.block_table) == -(-seq.num_computed_tokens // bs), "blocks of rejected tokens kept"
        for b in seq.block_table:
            holders[b] += 1
    assert holders == kv.ref_count
    assert not set(kv.blocks.pool.free_blocks) & {b for b, r in enumerate(kv.ref_count) if r}


def drain_checked(engine) -> dict:
    """Step until every request is done, checking the blocks after each step; {request id: finished output}."""
    outs = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.finished:
                outs[o.request_id] = o
        check_blocks(engine)
    return outs


def run_checked(llm, ps, params):
    """LLM.generate, stepping the engine by hand so the block check runs after every step."""
    for i, p in enumerate(ps):
        llm.engine.add_request(str(i), prompt_token_ids=p, params=params)
    outs = drain_checked(llm.engine)
    return [outs[str(i)] for i in range(len(ps))]


def cached_prefixes(cache):
    """Every token prefix the prefix cache holds K/V for."""
    if hasattr(cache, "block_key"):  # hash cache: follow each block's chain of parent hashes
        by_hash = {h: (parent, tokens) for h, parent, tokens in cache.block_key.values()}
        out = []
        for h in by_hash:
            chain = []
            while h in by_hash:
                h, tokens = by_hash[h]
                chain = list(tokens) + chain
            out.append(chain)
        return out
    out, stack = [], [(cache.root, [])]
    while stack:
        node, prefix = stack.pop()
        path = prefix + list(node.tokens)
        if node is not cache.root:
            out.append(path)
        stack += [(child, path) for child in node.children.values()]
    return out


@pytest.mark.parametrize("config, method", CASES,
                         ids=[",".join(f"{k}={v}" for k, v in c.items()) + f",{m}" for c, m in CASES])
def test_greedy_identical_with_speculation(config, method, qwen2_dir, other_draft, ref):
    ps, expected = ref
    llm = LLM(str(qwen2_dir), dtype="float32", speculative_config=spec_configs(qwen2_dir, other_draft)[method], **config)
    for _ in range(2):  # with a prefix cache: hits the second time
        outs = run_checked(llm, ps, GREEDY)
        assert [o.outputs[0].token_ids for o in outs] == expected
        if "num_kv_blocks" in config:
            assert any(o.metrics.num_preemptions for o in outs), "the tiny pool was meant to preempt"
    engine = llm.engine
    stats = engine.plugin(SpeculativeDecoder).stats
    assert stats.num_draft_tokens > 0
    if method == "draft=target":  # the target proposes exactly what it will choose
        assert stats.num_accepted_tokens == stats.num_draft_tokens
    if method == "draft=random":
        assert stats.num_accepted_tokens < stats.num_draft_tokens
    if engine.prefix_cache is not None:
        finals = [p + e for p, e in zip(ps, expected)]
        for prefix in cached_prefixes(engine.prefix_cache):
            assert any(f[: len(prefix)] == prefix for f in finals), f"cache holds tokens never accepted: {prefix}"
        engine.kv.clear()
    assert not any(engine.kv.ref_count)
    assert engine.kv.num_free_blocks == engine.kv.num_blocks, "KV blocks leaked"


def test_speculation_actually_verifies_several_tokens_per_pass(qwen2_dir, other_draft, ref):
    """The point of it: with the target as its own draft, k tokens are accepted per verify."""
    ps, expected = ref
    llm = LLM(str(qwen2_dir), dtype="float32", block_size=4, speculative_config=spec_configs(qwen2_dir, other_draft)["draft=target"])
    outs = llm.generate(prompt_token_ids=ps, sampling_params=GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == expected
    assert llm.engine.plugin(SpeculativeDecoder).stats.mean_tokens_per_verify > 4.0


def test_n_greater_than_one_and_sampling_in_one_batch(qwen2_dir, other_draft, ref):
    ps, expected = ref
    for method in ("ngram", "draft=random"):
        llm = LLM(str(qwen2_dir), dtype="float32", block_size=4, num_kv_blocks=40,
                  speculative_config=spec_configs(qwen2_dir, other_draft)[method])
        engine = llm.engine
        greedy_n = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, n=3)
        sampled = SamplingParams(temperature=0.9, top_k=20, max_tokens=24, ignore_eos=True, n=2, seed=5)
        engine.add_request("g", prompt_token_ids=ps[0], params=greedy_n)
        engine.add_request("s", prompt_token_ids=ps[1], params=sampled)
        engine.add_request("p", prompt_token_ids=ps[4], params=GREEDY)
        outs = drain_checked(engine)
        assert [c.token_ids for c in outs["g"].outputs] == [expected[0]] * 3
        assert outs["p"].outputs[0].token_ids == expected[4]
        assert [len(c.token_ids) for c in outs["s"].outputs] == [24, 24]
        engine.kv.clear()
        assert_idle_and_blocks_free(engine)


def test_seeded_sampling_is_reproducible_with_speculation(qwen2_dir, other_draft, ref):
    ps, _ = ref
    params = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=20, ignore_eos=True, seed=7)
    runs = [[o.outputs[0].token_ids for o in
             LLM(str(qwen2_dir), dtype="float32", speculative_config=spec_configs(qwen2_dir, other_draft)["draft=random"])
             .generate(prompt_token_ids=ps, sampling_params=params)] for _ in range(2)]
    assert runs[0] == runs[1]


def test_constraint_cuts_forbidden_proposals_and_output_is_unchanged(qwen2_dir, other_draft, tokenizer):
    """A proposal the regex forbids is cut before verification: output equals plain constrained decoding."""
    ps = prompts(tokenizer)[:3]
    params = SamplingParams(temperature=0, max_tokens=30, regex=r"[a-z ]{5,40}")
    plain = LLM(str(qwen2_dir), dtype="float32", block_size=4).generate(prompt_token_ids=ps, sampling_params=params)
    for method in ("ngram", "draft=random"):
        llm = LLM(str(qwen2_dir), dtype="float32", block_size=4, speculative_config=spec_configs(qwen2_dir, other_draft)[method])
        outs = llm.generate(prompt_token_ids=ps, sampling_params=params)
        assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in plain]
        assert llm.engine.plugin(SpeculativeDecoder).stats.num_draft_tokens > 0


def test_stop_token_inside_accepted_proposals_ends_the_request_there(qwen2_dir, other_draft, ref):
    """A request that stops on a token inside an accepted run keeps nothing after it."""
    ps, expected = ref
    stop = expected[1][5]
    params = SamplingParams(temperature=0, max_tokens=24, stop_token_ids=[stop], ignore_eos=True)
    llm = LLM(str(qwen2_dir), dtype="float32", block_size=4, speculative_config=spec_configs(qwen2_dir, other_draft)["draft=target"])
    out = llm.generate(prompt_token_ids=[ps[1]], sampling_params=params)[0].outputs[0]
    assert out.token_ids == expected[1][: expected[1].index(stop) + 1]
    llm.engine.kv.clear()
    assert_idle_and_blocks_free(llm.engine)


# -- the shipped model, against transformers ---------------------------------------------------
CHATS = [
    [{"role": "system", "content": "You are HAMLET in Hamlet. Stay in character and answer in Shakespeare's words."},
     {"role": "user", "content": "HORATIO: My lord, the king your father's ghost walks upon the platform."}],
    [{"role": "user", "content": "Say this again: to be, or not to be, that is the question."}],
]


@pytest.mark.parametrize("spec", ["ngram", "draft"])
def test_shipped_model_matches_transformers_with_speculation(spec):
    target = TINY_MODEL_DIR
    draft = TINY_MODEL_DIR.parent / "tiny_draft"
    config = NGRAM if spec == "ngram" else {"method": "draft_model", "model": str(draft), "num_speculative_tokens": 3}
    llm = LLM(str(target), dtype="float32", speculative_config=config)
    ids = [llm.apply_chat_template(c) for c in CHATS]
    expected = reference(target, ids)
    outs = llm.generate(prompt_token_ids=ids, sampling_params=GREEDY)
    assert [o.outputs[0].token_ids for o in outs] == expected
    assert llm.engine.plugin(SpeculativeDecoder).stats.num_accepted_tokens > 0


# -- bad configurations ------------------------------------------------------------------------
@pytest.mark.parametrize("config, words", [
    ({"method": "medusa", "num_speculative_tokens": 2}, "method='medusa' is unknown"),
    ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens=0 must be an integer >= 1"),
    ({"method": "ngram", "num_speculative_tokens": 2.5}, "num_speculative_tokens=2.5"),
    ({"method": "ngram"}, "num_speculative_tokens=None"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 3, "prompt_lookup_max": 2}, "prompt_lookup_min=3 is larger"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 0}, "prompt_lookup_max=0"),
    ({"method": "ngram", "num_speculative_tokens": 2, "model": "x"}, "does not take"),
    ({"method": "draft_model", "num_speculative_tokens": 2}, "needs model"),
    ("ngram", "must be a dict"),
])
def test_bad_speculative_config_is_refused(config, words, qwen2_dir):
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace("[", r"\[")):
        LLM(str(qwen2_dir), dtype="float32", speculative_config=config)


def test_draft_with_another_vocabulary_or_tokenizer_is_refused(qwen2_dir, tmp_path):
    def draft_like_target(name, change):
        folder = tmp_path / name
        shutil.copytree(qwen2_dir, folder)
        change(folder)
        return {"method": "draft_model", "num_speculative_tokens": 2, "model": str(folder)}

    def bigger_vocab(folder):
        config = json.loads((folder / "config.json").read_text())
        config["vocab_size"] += 64
        (folder / "config.json").write_text(json.dumps(config))

    def swapped_ids(folder):  # the same tokens, two of them under each other's ids
        tj = json.loads((folder / "tokenizer.json").read_text())
        vocab = tj["model"]["vocab"]
        a, b = sorted(vocab, key=vocab.get)[100:102]
        vocab[a], vocab[b] = vocab[b], vocab[a]
        (folder / "tokenizer.json").write_text(json.dumps(tj))

    with pytest.raises(ValueError, match="vocab_size=.* differs from the target's"):
        LLM(str(qwen2_dir), dtype="float32", speculative_config=draft_like_target("vocab", bigger_vocab))
    with pytest.raises(ValueError, match="tokenizer .* maps tokens to other ids"):
        LLM(str(qwen2_dir), dtype="float32", speculative_config=draft_like_target("ids", swapped_ids))


def test_speculation_needs_a_kv_cache(qwen2_dir):
    with pytest.raises(ValueError, match="kv_cache='paged' or 'contiguous'"):
        LLM(str(qwen2_dir), dtype="float32", kv_cache="none", speculative_config=NGRAM)


def test_spec_bench_reports_acceptance_and_speedup_from_its_rounds(qwen2_dir, tmp_path):
    from nano_infer.bench import spec as spec_bench

    results = spec_bench.run(requests=3, batches=(1, 3), batch1_requests=2, max_tokens=6, rounds=2,
                             draft=qwen2_dir, model=str(qwen2_dir), block_size=4)
    assert [(r["workload"], r["batch"], r["requests"]) for r in results] == [
        ("edit", 1, 2), ("edit", 3, 3), ("chat", 1, 2), ("chat", 3, 3)]
    for r in results:
        assert len(r["rounds"]) == 2
        for row in r["rounds"]:
            assert row["speedup"] == pytest.approx(row["base_s"] / row["spec_s"])
            assert row["accepted"] <= row["proposed"] and row["emitted"] == row["accepted"] + row["verifies"]
        tok_s = [statistics.median(x["tokens"] / x[k] for x in r["rounds"]) for k in ("spec_s", "base_s")]
        assert r["median"]["speedup"] == pytest.approx(tok_s[0] / tok_s[1])  # the medians' ratio
        assert spec_bench.speedup_text(r).startswith(
            f"speculative {tok_s[0]:,.1f} tok/s / plain {tok_s[1]:,.1f} tok/s = {tok_s[0] / tok_s[1]:.2f}x (rounds ")
    chat = [r for r in results if r["workload"] == "chat"]
    assert all(r["median"]["acceptance_rate"] == 1.0 for r in chat)  # the target is its own draft


def test_cli_takes_a_speculative_config(qwen2_dir, capsys):
    from nano_infer.cli.main import main

    args = ["generate", "To be, or not", "--model", str(qwen2_dir), "--max-tokens", "8", "--ignore-eos"]
    assert main(args + ["--speculative-config", json.dumps(NGRAM)]) == 0
    expected = LLM(str(qwen2_dir), dtype="float32").generate(["To be, or not"], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    assert capsys.readouterr().out == expected[0].outputs[0].text + "\n"
    assert main(args + ["--speculative-config", "{'method': 'ngram'}"]) == 2
    assert "--speculative-config is not valid JSON" in capsys.readouterr().err
    assert main(args + ["--speculative-config", '{"method": "eagle", "num_speculative_tokens": 2}']) == 2
    assert "method='eagle' is unknown" in capsys.readouterr().err


def test_spec_bench_verdict_comes_from_every_round_and_the_quote_workload_quotes_its_passage():
    from nano_infer.bench import spec as spec_bench

    rounds = lambda *xs: {"rounds": [{"speedup": x} for x in xs]}  # noqa: E731
    assert spec_bench.speculation_verdict(rounds(1.6, 1.8)) == "pays"
    assert spec_bench.speculation_verdict(rounds(0.6, 1.45, 2.53)) == "inconclusive"
    assert spec_bench.speculation_verdict(rounds(0.8, 0.9)) == "does not pay"
    (prompt,) = spec_bench.quote_prompts(1)
    assert prompt[-1]["content"].endswith(spec_bench.PASSAGES[0])
