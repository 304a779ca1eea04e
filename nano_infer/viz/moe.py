"""Chapter 15's pictures: where the router sends each token, how the load falls on the experts, and how many
experts a step reads as the batch grows.

`recorded_routes` listens to every sparse layer of a running engine's model (rank 0's) and keeps what its
router saw: the layer's input rows and the router's logits, one entry per forward pass. `route_figure`
draws the routing weights of a prompt's tokens (tokens down, experts across, zero where an expert was not
chosen), `load_figure` the pairs each expert received over a batch beside what even routing would give,
and `experts_read_figure` the experts a step reads and the weights each token costs against the batch.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from ..models.moe import SparseMoeBlock, route
from . import FIGURE_WIDTH, LEGEND_BELOW


@dataclass
class Routes:
    """Per sparse layer (in model order), one (input rows [T, hidden], router logits [T, E]) per forward pass."""

    layers: list[str]
    calls: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = field(default_factory=dict)

    def routed(self, layer: int, call: int, top_k: int, norm_topk_prob: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [T, k], experts [T, k]) of one layer in one forward pass, as the engine's `route` picks them."""
        return route(self.calls[self.layers[layer]][call][1], top_k, norm_topk_prob)


@contextlib.contextmanager
def recorded_routes(model: torch.nn.Module):
    """Inside the block every sparse layer's router records its input and logits (in float32, on the CPU)."""
    blocks = {name: m for name, m in model.named_modules() if isinstance(m, SparseMoeBlock)}
    routes = Routes(list(blocks), {name: [] for name in blocks})

    def hook(name):
        def keep(module, inputs, output):
            routes.calls[name].append((inputs[0].detach().float().cpu(), output.detach().float().cpu()))
        return keep

    handles = [block.gate.register_forward_hook(hook(name)) for name, block in blocks.items()]
    try:
        yield routes
    finally:
        for h in handles:
            h.remove()


def dense_weights(weights: torch.Tensor, experts: torch.Tensor, num_experts: int) -> torch.Tensor:
    """[T, E]: each token's routing weight for every expert, zero for the experts it was not sent to."""
    return torch.zeros(len(weights), num_experts).scatter_(1, experts, weights.float())


def route_figure(tokens: list[str], panels: dict[str, torch.Tensor], title: str) -> go.Figure:
    """panels: name -> [T, E] routing weights (`dense_weights`), drawn side by side on one colour scale;
    tokens: the y labels, one per row."""
    fig = make_subplots(rows=1, cols=len(panels), shared_yaxes=True, horizontal_spacing=0.03,
                        subplot_titles=list(panels))
    top = max(float(w.max()) for w in panels.values())
    rows = [f"{i}: {t}" for i, t in enumerate(tokens)]
    for col, (name, w) in enumerate(panels.items(), start=1):
        z = [[v if v > 0 else None for v in row] for row in w.tolist()]  # unchosen experts stay blank
        fig.add_heatmap(z=z, x=list(range(w.shape[1])), y=rows, coloraxis="coloraxis",
                        hovertemplate="%{y}, expert %{x}: weight %{z:.3f}<extra>" + name + "</extra>", row=1, col=col)
        fig.update_xaxes(title_text="expert", row=1, col=col)
    fig.update_yaxes(autorange="reversed", type="category", tickfont=dict(size=10))
    fig.update_layout(title=title, width=FIGURE_WIDTH, height=max(360, 16 * len(tokens) + 160),
                      coloraxis=dict(colorscale="Viridis", cmin=0, cmax=top,
                                     colorbar=dict(title="weight", thickness=12)),
                      plot_bgcolor="#f4f4f4")
    return fig


def load_figure(counts: torch.Tensor, chance_max: float, title: str) -> go.Figure:
    """counts: [E] pairs each expert received. A bar per expert, the mean (what perfectly even routing gives) and
    `chance_max`, the busiest expert's load when the same pairs are routed uniformly at random."""
    mean = float(counts.float().mean())
    fig = go.Figure()
    fig.add_bar(x=list(range(len(counts))), y=counts.tolist(), name="pairs this expert received",
                marker_color="#3182bd", hovertemplate="expert %{x}: %{y} pairs<extra></extra>")
    for y, name, dash in ((mean, "mean (even routing)", "dash"), (chance_max, "busiest expert under uniform routing",
                                                                   "dot")):
        fig.add_scatter(x=[-0.5, len(counts) - 0.5], y=[y, y], mode="lines", name=name,
                        line=dict(color="#d62728" if dash == "dash" else "#636363", dash=dash))
    fig.update_layout(title=title, width=FIGURE_WIDTH, height=380, legend=LEGEND_BELOW, bargap=0.1,
                      xaxis=dict(title="expert"), yaxis=dict(title="token-expert pairs"))
    return fig


def experts_read_figure(batches: list[int], expected: list[float], measured: list[float], num_experts: int,
                        per_token: dict[str, list[float]], unit: str, title: str) -> go.Figure:
    """Left: distinct experts a layer reads in a step of B tokens (uniform routing's expectation, and measured).
    Right: the weights a step reads divided by its B tokens, one line per model (name -> amounts in `unit`)."""
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12,
                        subplot_titles=["experts a layer reads in one step", "weights read per token"])
    fig.add_scatter(x=batches, y=expected, mode="lines", name="E (1 - (1 - k/E)^B)", line=dict(color="#fd8d3c"),
                    row=1, col=1)
    fig.add_scatter(x=batches, y=measured, mode="markers", name="measured (the model's routing)",
                    marker=dict(color="#d62728", size=8), row=1, col=1)
    fig.add_scatter(x=[batches[0], batches[-1]], y=[num_experts] * 2, mode="lines", name="all the experts",
                    line=dict(color="#636363", dash="dot"), row=1, col=1)
    colours = ["#3182bd", "#31a354", "#756bb1"]
    for (name, values), colour in zip(per_token.items(), colours):
        fig.add_scatter(x=batches, y=values, mode="lines+markers", name=name, line=dict(color=colour), row=1, col=2)
    fig.update_xaxes(type="log", tickvals=batches, title_text="tokens in the step (B)")
    fig.update_yaxes(title_text="experts", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(type="log", title_text=f"{unit} per token", row=1, col=2)
    fig.update_layout(title=title, width=FIGURE_WIDTH, height=420, legend=LEGEND_BELOW)
    return fig
