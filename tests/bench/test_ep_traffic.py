"""The rows an expert-parallel dispatch sends between ranks, and the bytes per layer of each design (chapter 15)."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nano_infer.bench.ep_traffic import layer_traffic, pair_counts, rank_of_expert


@st.composite
def routings(draw):
    world, per_rank, tokens = draw(st.integers(1, 4)), draw(st.integers(1, 4)), draw(st.integers(1, 12))
    k = draw(st.integers(1, world * per_rank))
    experts = [draw(st.permutations(range(world * per_rank)))[:k] for _ in range(tokens)]
    return experts, [draw(st.integers(0, world - 1)) for _ in range(tokens)], world * per_rank, world


@settings(max_examples=40, deadline=None)
@given(routings())
def test_pair_counts_are_the_pairs_from_each_tokens_rank_to_each_experts_rank(case):
    experts, token_rank, num_experts, world = case
    want = [[0] * world for _ in range(world)]
    for chosen, src in zip(experts, token_rank):
        for e in chosen:
            want[src][e * world // num_experts] += 1
    assert pair_counts(torch.tensor(experts), torch.tensor(token_rank), num_experts, world).tolist() == want


def test_experts_are_cut_into_contiguous_whole_blocks():
    assert rank_of_expert(torch.arange(8), 8, 4).tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    with pytest.raises(ValueError, match="num_experts=6"):
        rank_of_expert(torch.arange(6), 6, 4)


def test_the_all_to_all_sends_k_over_world_times_the_all_reduces_bytes():
    two = layer_traffic(tokens=64, hidden=256, top_k=8, world=2, value_bytes=2)
    assert two["all-reduce"] == 64 * 256 * 2  # a ring all-reduce at two ranks: each sends the whole output once
    assert two["all-to-all"] == 2 * 32 * 8 * 0.5 * 256 * 2  # 32 tokens x 8 pairs, half of them leave, and come back
    eight = layer_traffic(tokens=64, hidden=256, top_k=8, world=8, value_bytes=2)
    assert eight["all-to-all"] == pytest.approx(eight["all-reduce"])  # k == world
