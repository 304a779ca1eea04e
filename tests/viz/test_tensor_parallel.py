"""The shard picture draws exactly the slices the loader cuts."""
from types import SimpleNamespace

from nano_infer.viz.tensor_parallel import shard_figure, shard_spans

CONFIG = SimpleNamespace(num_attention_heads=8, num_key_value_heads=2, intermediate_size=512, vocab_size=4097)


def test_spans_cover_each_axis_once_except_replicated_kv_heads():
    for size in (2, 4):
        spans = shard_spans(CONFIG, size)
        for cut, total in (("query heads", 8), ("MLP features", 512), ("vocabulary rows", 4097)):
            covered = sorted(i for _, a, b in spans[cut] for i in range(a, b))
            assert covered == list(range(total)), (size, cut)
        kv = sorted(i for _, a, b in spans["KV heads"] for i in range(a, b))
        assert kv == ([0, 1] if size == 2 else [0, 0, 1, 1])  # 4 ranks, 2 KV heads: each held twice


def test_figure_has_one_bar_per_rank_and_cut():
    fig = shard_figure(CONFIG, sizes=(2, 4))
    assert len(fig.data) == 4 * (2 + 4)
    assert {bar.y[0] for bar in fig.data} == {f"rank {r}" for r in range(4)}
