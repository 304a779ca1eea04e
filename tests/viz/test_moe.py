"""Chapter 15 figures: the routes a running model's sparse layers took, a prompt's routing weights, the load per
expert and the experts a step reads."""
from types import SimpleNamespace

import torch
from torch import nn

from nano_infer.models.moe import SparseMoeBlock, route
from nano_infer.viz.moe import (dense_weights, experts_read_figure, load_figure, recorded_routes,
                                route_figure)

CONFIG = SimpleNamespace(hidden_size=8, num_experts=6, num_experts_per_tok=2, norm_topk_prob=True,
                         moe_intermediate_size=4)


def moe_stack():
    torch.manual_seed(0)
    model = nn.Sequential(SparseMoeBlock(CONFIG), SparseMoeBlock(CONFIG))
    for p in model.parameters():
        p.data.normal_(0, 0.5)
    return model


def test_every_sparse_layer_records_each_pass_and_stops_after_the_block():
    model, x = moe_stack(), torch.randn(5, 8)
    with recorded_routes(model) as routes:
        model(x)
        model(x[:3])
    model(x)  # after the block: not recorded
    assert routes.layers == ["0", "1"]
    assert [len(routes.calls[n]) for n in routes.layers] == [2, 2]
    rows, logits = routes.calls["1"][1]
    assert rows.shape == (3, 8) and logits.shape == (3, 6)
    assert torch.equal(routes.calls["0"][0][0], x)  # the first layer's input is the model's
    weights, experts = routes.routed(0, 0, 2, True)
    want = route(model[0].gate(x), 2, True)
    assert torch.equal(experts, want[1]) and torch.allclose(weights, want[0])


def test_dense_weights_put_each_weight_under_its_expert():
    weights, experts = torch.tensor([[0.75, 0.25], [0.5, 0.5]]), torch.tensor([[2, 0], [5, 3]])
    dense = dense_weights(weights, experts, 6)
    assert dense.tolist() == [[0.25, 0, 0.75, 0, 0, 0], [0, 0, 0, 0.5, 0, 0.5]]


def test_figures_draw_a_panel_per_layer_a_bar_per_expert_and_a_line_per_model():
    w = dense_weights(torch.full((3, 2), 0.5), torch.tensor([[0, 1], [1, 2], [2, 3]]), 4)
    fig = route_figure(["a", "b", "c"], {"layer 0": w, "layer 3": w}, "routes")
    heatmaps = [t for t in fig.data if t.type == "heatmap"]
    assert len(heatmaps) == 2 and list(heatmaps[0].z[0]) == [0.5, 0.5, None, None]  # unchosen experts are blank
    fig = load_figure(torch.tensor([3, 1, 0, 4]), 3.5, "load")
    assert list(fig.data[0].y) == [3, 1, 0, 4] and fig.data[1].y == (2.0, 2.0) and fig.data[2].y == (3.5, 3.5)
    fig = experts_read_figure([1, 2], [2.0, 3.5], [2.0, 3.0], 4, {"a": [10.0, 6.0], "b": [20.0, 10.0]}, "GiB",
                              "read")
    assert [t.name for t in fig.data][3:] == ["a", "b"] and fig.layout.yaxis2.title.text == "GiB per token"
