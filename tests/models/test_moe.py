"""The parts of a Mixture-of-Experts layer (models/moe.py) against plain per-token loops written here, and how
the experts load and shard."""
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from nano_infer import LLM
from nano_infer.config import EngineConfig
from nano_infer.distributed import TPShard, check_tp_sizes
from nano_infer.models.loader import load_config, load_model
from nano_infer.models.moe import Experts, group_by_expert, is_sparse_layer, route
from tests.helpers.model_factory import MOE_FAMILIES, make_moe_dir


def expert_mlp(x, gate_up, down):
    gate, up = (x @ gate_up.T).chunk(2)
    return (F.silu(gate) * up) @ down.T


def per_token(x, weights, experts, gate_up, down):
    """Each token's output: its experts' outputs, weighted, summed one token at a time."""
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for w, e in zip(weights[t].tolist(), experts[t].tolist()):
            out[t] += w * expert_mlp(x[t], gate_up[e], down[e])
    return out


def random_experts(num_experts, hidden, inter, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(num_experts, 2 * inter, hidden, generator=g), torch.randn(num_experts, hidden, inter, generator=g)


def experts_module(gate_up, down, first=0, count=None):
    count = gate_up.shape[0] if count is None else count
    m = Experts(count, first, gate_up.shape[2], down.shape[2])
    m.gate_up_proj.data = gate_up[first:first + count].clone()
    m.down_proj.data = down[first:first + count].clone()
    return m


@settings(max_examples=40, deadline=None)
@given(tokens=st.integers(1, 9), num_experts=st.sampled_from([1, 4, 16]), top_k=st.integers(1, 4),
       norm=st.booleans(), seed=st.integers(0, 2**16))
def test_router_is_softmax_then_top_k(tokens, num_experts, top_k, norm, seed):
    top_k = min(top_k, num_experts)
    logits = torch.randn(tokens, num_experts, generator=torch.Generator().manual_seed(seed))
    weights, experts = route(logits, top_k, norm)
    probs = logits.softmax(-1)
    for t in range(tokens):
        ranked = sorted(range(num_experts), key=lambda e: -probs[t, e].item())[:top_k]
        assert experts[t].tolist() == ranked
        picked = probs[t, ranked]
        expected = picked / picked.sum() if norm else picked
        assert torch.allclose(weights[t], expected, atol=1e-6)


@settings(max_examples=40, deadline=None)
@given(tokens=st.integers(1, 12), num_experts=st.sampled_from([2, 5, 8]), top_k=st.integers(1, 3),
       seed=st.integers(0, 2**16))
def test_grouped_matmul_is_the_per_token_sum(tokens, num_experts, top_k, seed):
    top_k = min(top_k, num_experts)
    g = torch.Generator().manual_seed(seed)
    gate_up, down = random_experts(num_experts, 8, 6, seed)
    x = torch.randn(tokens, 8, generator=g)
    weights, experts = route(torch.randn(tokens, num_experts, generator=g), top_k, True)
    out = experts_module(gate_up, down)(x, weights, experts)
    assert torch.allclose(out, per_token(x, weights, experts, gate_up, down), atol=1e-4)


@settings(max_examples=30, deadline=None)
@given(tokens=st.integers(1, 12), ranks=st.sampled_from([2, 4]), seed=st.integers(0, 2**16))
def test_expert_shards_sum_to_the_whole_layer(tokens, ranks, seed):
    """Each rank's whole experts (expert parallelism) or slice of every expert's features: partial sums that add
    up to the layer, as the all-reduce adds them."""
    g = torch.Generator().manual_seed(seed)
    gate_up, down = random_experts(8, 8, 4, seed)
    x = torch.randn(tokens, 8, generator=g)
    weights, experts = route(torch.randn(tokens, 8, generator=g), 3, False)
    whole = per_token(x, weights, experts, gate_up, down)
    share = 8 // ranks
    by_experts = sum(experts_module(gate_up, down, r * share, share)(x, weights, experts) for r in range(ranks))
    assert torch.allclose(by_experts, whole, atol=1e-4)
    n = 4 // ranks  # of each expert's 4 features
    by_features = 0
    for r in range(ranks):
        gate, up = gate_up.chunk(2, dim=1)
        rows = slice(r * n, (r + 1) * n)
        sliced = experts_module(torch.cat([gate[:, rows], up[:, rows]], dim=1), down[:, :, rows])
        by_features = by_features + sliced(x, weights, experts)
    assert torch.allclose(by_features, whole, atol=1e-4)


def test_group_by_expert_lists_each_experts_pairs_together_in_token_order():
    experts = torch.tensor([[2, 0], [0, 1], [2, 1]])
    order, counts = group_by_expert(experts, 4)
    assert counts.tolist() == [2, 2, 2, 0]
    assert experts.flatten()[order].tolist() == [0, 0, 1, 1, 2, 2]
    assert (order // 2).tolist() == [0, 1, 1, 2, 0, 2]  # the tokens, in order within each expert


def test_qwen3_moe_keeps_the_layers_its_config_names_dense():
    from transformers import Qwen3MoeConfig

    config = Qwen3MoeConfig(num_hidden_layers=4, mlp_only_layers=[0], decoder_sparse_step=2, num_experts=4)
    assert [is_sparse_layer(config, i) for i in range(4)] == [False, True, False, True]


@pytest.fixture(scope="module")
def moe_dirs(tmp_path_factory, tokenizer):
    return {f: make_moe_dir(f, tmp_path_factory.mktemp(f), tokenizer) for f in MOE_FAMILIES}


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_each_rank_loads_its_experts_whole_or_its_slice_of_each(moe_dirs, family):
    folder = moe_dirs[family]
    cfg = load_config(folder)
    full = load_model(folder, cfg, torch.device("cpu"), torch.float32, 64).state_dict()
    for expert_parallel in (False, True):
        shards = [load_model(folder, cfg, torch.device("cpu"), torch.float32, 64,
                             TPShard(r, 2, expert_parallel=expert_parallel)).state_dict() for r in range(2)]
        for name, weight in full.items():
            parts = [s[name] for s in shards]
            if name.endswith("experts.gate_up_proj") and not expert_parallel:  # [gate; up] rows of each expert
                halves = [p.chunk(2, dim=1) for p in parts]
                assert torch.equal(torch.cat([torch.cat([h[0] for h in halves], 1), torch.cat([h[1] for h in halves], 1)], 1), weight)
            elif name.endswith("experts.down_proj") and not expert_parallel:
                assert torch.equal(torch.cat(parts, dim=2), weight)
            elif ".experts." in name:  # expert parallelism: the first half of the experts on rank 0, the rest on 1
                assert 2 * parts[0].shape[0] == weight.shape[0] and torch.equal(torch.cat(parts), weight)
            elif "q_norm" in name and family == "olmoe":  # one weight over all query heads: each rank its heads'
                assert torch.equal(torch.cat(parts), weight)


def test_bad_moe_settings_are_refused_before_the_weights_load(moe_dirs):
    with pytest.raises(ValueError, match="experts, which stay in the model's dtype"):
        LLM(str(moe_dirs["qwen3_moe"]), quantization="int8")
    shape = dict(model_type="qwen3_moe", num_attention_heads=12, num_key_value_heads=3, intermediate_size=96,
                 moe_intermediate_size=96, num_experts=16)
    with pytest.raises(ValueError, match="must divide num_experts=16"):
        check_tp_sizes(SimpleNamespace(**shape), 3, expert_parallel=True)
    with pytest.raises(ValueError, match="intermediate size 20 .*enable_expert_parallel"):
        check_tp_sizes(SimpleNamespace(**{**shape, "moe_intermediate_size": 20, "num_experts": 12}), 3)
    check_tp_sizes(SimpleNamespace(**{**shape, "moe_intermediate_size": 20, "num_experts": 12}), 3, expert_parallel=True)
    from transformers import MixtralConfig

    with pytest.raises(ValueError, match="sliding window of 4096 tokens"):
        EngineConfig().check_model(MixtralConfig(sliding_window=4096), None)
    with pytest.raises(ValueError, match="key norm spans all KV heads"):
        check_tp_sizes(SimpleNamespace(**{**shape, "model_type": "olmoe", "num_attention_heads": 8,
                                          "num_key_value_heads": 2, "intermediate_size": 32}), 4)
