"""The prefix-cache workloads and the plumbing that measures them (nano_infer.bench.prefix)."""
import pytest

from nano_infer import LLM
from nano_infer.bench import prefix as bp
from nano_infer.viz import radix as vr


def test_questions_are_distinct_and_bounded():
    qs = bp.questions(40)
    assert len(set(qs)) == 40 and all(": " in q for q in qs)
    with pytest.raises(ValueError):
        bp.questions(10_000)


@pytest.mark.parametrize("num_tokens", [1, 50, 200])
def test_system_prompt_is_the_shortest_that_reaches_the_length(tokenizer, num_tokens):
    def count(text):
        return len(tokenizer.encode(text, add_special_tokens=False))

    text = bp.system_prompt(tokenizer, num_tokens)
    role = bp.ROLE_LINE.format(character="HAMLET", play="Hamlet")
    assert text.startswith(role) and count(text) >= num_tokens
    if text != role:  # one scene note fewer would be too short
        last = next(note for note in bp.SCENE_NOTES if text.endswith(" " + note))
        assert count(text[: -len(last) - 1]) < num_tokens


def test_workload_shapes(tokenizer):
    shared = bp.shared_system_prompt(tokenizer, 6, 40)
    assert len(shared.paths) == 6 and all(len(p) == 1 for p in shared.paths)
    assert len(set(shared.paths)) == 6

    chat = bp.multi_turn_chat(tokenizer, 4, 40)
    assert [len(p) for p in chat.paths] == [1, 2, 3, 4]
    assert all(chat.paths[i + 1][: i + 1] == chat.paths[i] for i in range(3))

    tree = bp.branching_chat(tokenizer, num_branches=3, system_tokens=40, trunk_turns=2, branch_turns=2)
    assert len(tree.paths) == 2 + 3 * 2
    trunk = tree.paths[1]
    for i, path in enumerate(tree.paths):
        assert len(path) == 1 or path[:-1] in tree.paths[:i], "a request's history must have been asked before"
    branch_starts = [p for p in tree.paths if len(p) == 3]
    assert len(branch_starts) == 3 and all(p[:2] == trunk for p in branch_starts)
    assert len({p[2] for p in branch_starts}) == 3

    wide = bp.branching_chat(tokenizer, num_branches=3, system_tokens=40, trunk_turns=2, branch_turns=2,
                             breadth_first=True)
    assert sorted(wide.paths) == sorted(tree.paths)
    assert [len(p) for p in wide.paths] == [1, 2, 3, 3, 3, 4, 4, 4]  # every branch's first turn before any second
    assert all(len(p) == 1 or p[:-1] in wide.paths[:i] for i, p in enumerate(wide.paths))


def test_common_prefix():
    assert bp.common_prefix([[1, 2, 3, 4], [1, 2, 5], [1, 2, 3]]) == [1, 2]
    assert bp.common_prefix([[7, 8], [7, 8, 9]]) == [7, 8]
    assert bp.common_prefix([[1], [2]]) == []


def test_ttft_comparison_arithmetic():
    c = bp.TTFTComparison(ttft={"none": [0.4, 0.8, 0.6], "hash": [0.1, 0.3, 0.2]}, prompt_tokens=[100, 200, 300],
                          cached_tokens={"none": [0, 0, 0], "hash": [50, 150, 200]})
    assert c.median("none") == 0.6 and c.median("hash") == 0.2
    assert c.speedup("hash", "none") == pytest.approx(3.0)
    assert c.ideal_speedup("hash") == pytest.approx(3.0)  # median of 2, 4, 3
    assert c.ideal_speedup("none") == 1.0


@pytest.fixture(scope="module")
def llms(qwen2_dir):
    return {kind: LLM(str(qwen2_dir), dtype="float32", prefix_cache=kind, block_size=8, num_kv_blocks=128)
            for kind in (None, "hash", "radix")}


def test_prefill_tokens_are_prompt_minus_cached(llms, tokenizer):
    workloads = [bp.shared_system_prompt(tokenizer, 4, 60), bp.multi_turn_chat(tokenizer, 3, 20),
                 bp.branching_chat(tokenizer, 2, 20, branch_turns=2, breadth_first=True)]
    for workload in workloads:
        results = {kind: bp.run_workload(llm, workload, max_tokens=4) for kind, llm in llms.items()}
        for kind, result in results.items():
            stats = llms[kind].engine.prefix_cache.stats if kind else None
            for r in result.records:
                assert r.prefill_tokens == r.prompt_tokens - r.cached_tokens
                assert r.cached_tokens % 8 == 0 or r.cached_tokens == r.prompt_tokens - 1
            if kind is None:
                assert result.cached_tokens == 0 and result.prefill_tokens == result.prompt_tokens
            else:
                assert all(r.cached_tokens > 0 for r in result.records[1:]), (kind, workload.name)
                assert stats.hit_tokens >= result.cached_tokens
        outputs = {kind: [r.output_token_ids for r in res.records] for kind, res in results.items()}
        assert outputs["hash"] == outputs[None] and outputs["radix"] == outputs[None]
        assert [r.prompt_tokens for r in results["hash"].records] == [r.prompt_tokens for r in results[None].records]


def test_run_one_refuses_a_busy_engine(llms):
    llm = llms["hash"]
    llm.engine.add_request("busy", prompt_token_ids=[5, 6, 7], params=bp.greedy(2))
    try:
        with pytest.raises(ValueError, match="alone"):
            bp.run_one(llm, [5, 6, 7], 2)
    finally:
        llm.engine.abort_request("busy")


def test_compare_ttft_records_every_prompt(llms, tokenizer):
    workload = bp.shared_system_prompt(tokenizer, 4, 60)
    prompts = [bp.chat_prompt(tokenizer, [{"role": "system", "content": workload.system},
                                          {"role": "user", "content": q}]) for (q,) in workload.paths]
    pair = {"none": llms[None], "hash": llms["hash"]}
    llms["hash"].engine.kv.clear()  # earlier tests cached these very prompts
    c = bp.compare_ttft(pair, prompts[1:], warmup=prompts[0])
    assert all(len(c.ttft[k]) == 3 and all(t > 0 for t in c.ttft[k]) for k in pair)
    assert c.cached_tokens["none"] == [0, 0, 0]
    shared = len(bp.common_prefix(prompts))
    assert all(shared - 8 < n <= shared for n in c.cached_tokens["hash"])  # whole blocks of the system prompt
    assert c.ideal_speedup("hash") > 1.0


def test_staggered_run_and_tree_snapshots(llms, tokenizer):
    """Requests overlap (locks > 0 mid-run), outputs come back in order and match running alone."""
    system = bp.system_prompt(tokenizer, 30)
    prompts = [bp.chat_prompt(tokenizer, [{"role": "system", "content": system}, {"role": "user", "content": q}])
               for q in bp.questions(3)]
    llm = llms["radix"]
    cache = llm.engine.prefix_cache
    llm.engine.kv.clear()
    on_step, snaps = vr.record_tree(llm.engine.kv, tokenizer.decode)
    outs = bp.run_staggered(llm, prompts, 6, steps_between=1, on_step=on_step, request_ids=["a", "b", "c"])
    assert [o.request_id for o in outs] == ["a", "b", "c"]
    alone = [bp.run_one(llms[None], p, 6)[0].output_token_ids for p in prompts]
    assert [o.outputs[0].token_ids for o in outs] == alone
    assert any(sum(n.lock_ref > 0 for n in s.nodes) >= 1 and "running a, b" in s.title for s in snaps)
    assert all(n.lock_ref == 0 for n in snaps[-1].nodes)
    last = snaps[-1]
    assert sum(len(n.blocks) for n in last.nodes) == cache.num_cached_blocks()
    ends = {n.key: n.end for n in last.nodes}
    assert all(n.start == (0 if n.parent is None else ends[n.parent]) for n in last.nodes)
    fig = vr.tree_figure(last)
    bars = [t for t in fig.data if t.type == "bar"]
    assert sum(len(t.x) for t in bars) == len(last.nodes)
    assert vr.tree_text(last).count("\n") == len(last.nodes)
