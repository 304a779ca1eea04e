"""Chapter 11's recording of a beam request and its stepper: forks share the prompt, pruned beams give
their blocks back, and every cell's colour is its block's reference count."""
import pytest

from nano_infer import LLM, default_model
from nano_infer.beam import BeamSearchParams
from nano_infer.viz.beams import beam_round_figure, beam_stepper, record_beam_search

K, BS, NUM_BLOCKS = 4, 4, 64


@pytest.fixture(scope="module")
def recorded():
    llm = LLM(default_model(), dtype="float32", block_size=BS, prefix_cache=None, num_kv_blocks=NUM_BLOCKS)
    prompt = llm.apply_chat_template([{"role": "user", "content": "What news from Verona, good friend?"}])
    params = BeamSearchParams(K, 24)
    rounds = record_beam_search(llm.engine, "r", params, prompt)
    again = llm.beam_search({"prompt_token_ids": prompt}, params)[0]
    return llm, prompt, rounds, again


def test_round_one_forks_k_minus_one_children_on_the_prompt_blocks(recorded):
    _, prompt, rounds, _ = recorded
    first = rounds[0]
    assert first.round == 1 and len(first.beams) == K
    root = first.beams[0].parent
    assert sorted(first.forks) == sorted((root, b.seq_id) for b in first.beams if b.seq_id != root)
    assert len(first.forks) == K - 1
    prompt_blocks = first.beams[0].block_table
    assert len(prompt_blocks) == -(-len(prompt) // BS)
    assert all(b.block_table == prompt_blocks for b in first.beams)
    assert all(first.ref_counts[blk] == K for blk in prompt_blocks)


def test_each_beam_extends_its_parent_and_pruned_beams_give_their_blocks_back(recorded):
    _, prompt, rounds, _ = recorded
    for prev, rec in zip(rounds, rounds[1:]):
        if rec.done:
            break
        tokens = {b.seq_id: b.tokens for b in prev.beams}
        for b in rec.beams:
            assert b.tokens[:-1] == tokens[b.parent]
        extended = {b.parent for b in rec.beams}
        assert rec.pruned == sorted(set(tokens) - extended)
        # with no prefix cache, a block is referenced exactly by the live beams holding it, and the rest are free
        held = [blk for b in rec.beams for blk in b.block_table]
        assert all(rec.ref_counts[blk] == held.count(blk) for blk in range(NUM_BLOCKS))
        assert rec.num_free_blocks == NUM_BLOCKS - len(set(held))
    assert any(r.pruned for r in rounds) and any(r.copies for r in rounds) and any(r.freed_blocks for r in rounds)
    last = rounds[-1]
    assert last.done and not last.beams and last.num_free_blocks == NUM_BLOCKS and not any(last.ref_counts)


def test_the_recording_finds_the_same_hypotheses_as_llm_beam_search(recorded):
    _, prompt, rounds, again = recorded
    assert [f.tokens for f in rounds[-1].finished] == [s.output_tokens for s in again.sequences]


def test_cells_are_coloured_by_ref_count_and_frames_match_the_single_figures(recorded):
    llm, _, rounds, _ = recorded
    fig = beam_stepper(rounds, llm.tokenizer.decode)
    assert len(fig.frames) == len(rounds)
    assert fig.layout.sliders[0].steps[-1].label.endswith("(done)")
    for i in (0, 1, len(rounds) // 2):
        heat = next(t for t in fig.frames[i].data if t.type == "heatmap")
        rec = rounds[i]
        for b in rec.beams:
            assert list(heat.z[b.rank][: len(b.block_table)]) == [rec.ref_counts[blk] for blk in b.block_table]
            assert list(heat.text[b.rank][: len(b.block_table)]) == [str(blk) for blk in b.block_table]
        single = beam_round_figure(rounds, i, llm.tokenizer.decode, width=K,
                                   num_columns=max(len(b.block_table) for r in rounds for b in r.beams),
                                   zmax=max(max(r.ref_counts) for r in rounds))
        assert [t.type for t in fig.frames[i].data] == [t.type for t in single.data]
        assert fig.frames[i].layout.title.text == single.layout.title.text
    first_copy = next(i for i, r in enumerate(rounds) if r.copies and not r.done)
    outlined = fig.frames[first_copy].data[-1]  # the copy-on-write outlines
    assert len(outlined.x) == sum(blk in {c for _, c in rounds[first_copy].copies}
                                  for b in rounds[first_copy].beams for blk in b.block_table) > 0
