"""Chapter 14's pictures: where the rounding error of an 8-bit KV cache falls, and what the bytes it saves buy.

`channel_figure` draws one layer's K and V as the pool holds them (tokens down, every KV head's
channels across), the magnitude of each value on top and, below, the rounding error each channel
gets from int8 with each choice of scales: a channel much larger than the rest (an outlier channel)
shows as a bright column, and with one scale per token the error it causes falls on all the other
channels of its tokens; rotated first (what the engine does), the error is spread evenly.
`running_side_by_side` puts the scheduler's timelines of one workload under several KV formats next
to each other (chapter 05's request lifecycle: waiting, running, finished, and the preemptions).
"""
from __future__ import annotations

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from ..engine.memory import StepRecord
from . import FIGURE_WIDTH, LEGEND_BELOW
from .timeline import lifecycle_figure

PALETTE = {"per token": "#1f77b4", "per channel": "#ff7f0e", "rotated, per token": "#2ca02c"}


def channel_labels(num_heads: int, head_dim: int) -> list[str]:
    """'h0 c5' for channel 5 of KV head 0: the x axis of a [tokens, heads * head_dim] picture."""
    return [f"h{h} c{c}" for h in range(num_heads) for c in range(head_dim)]


def channel_figure(k: torch.Tensor, v: torch.Tensor, errors: dict[str, dict[str, torch.Tensor]],
                   title: str = "K and V of one layer, channel by channel") -> go.Figure:
    """k, v: [tokens, kv_heads, head_dim]. errors: {"K": {"per token": [channels], ...}, "V": {...}}, the mean
    absolute rounding error of each channel (heads * head_dim of them) under each choice of scales.

    Top row: |K| and |V| as heatmaps, each on its own colour scale (its largest value brightest). Bottom
    row: the error per channel, one line per choice of scales, on one y axis for K and V alike."""
    tokens, heads, dim = k.shape
    labels = channel_labels(heads, dim)
    fig = make_subplots(rows=2, cols=2, shared_xaxes=True, vertical_spacing=0.08, horizontal_spacing=0.08,
                        row_heights=[0.6, 0.4], subplot_titles=["|K|", "|V|", "K: rounding error per channel (int8)",
                                                                "V: rounding error per channel (int8)"])
    for col, (name, x) in enumerate((("K", k), ("V", v)), start=1):
        mag = x.float().abs().reshape(tokens, heads * dim)
        fig.add_heatmap(z=mag.tolist(), x=list(range(heads * dim)), y=list(range(tokens)), colorscale="Viridis",
                        zmin=0, coloraxis=f"coloraxis{col}", customdata=[labels] * tokens,
                        hovertemplate="token %{y}, %{customdata}: |" + name + "| = %{z:.3g}<extra></extra>",
                        row=1, col=col)
        for kind, err in errors[name].items():
            fig.add_scatter(x=list(range(heads * dim)), y=err.float().tolist(), mode="lines", name=kind,
                            line=dict(color=PALETTE.get(kind), width=1.5), legendgroup=kind, showlegend=col == 1,
                            customdata=labels, hovertemplate="%{customdata}: %{y:.2e}<extra>" + kind + "</extra>",
                            row=2, col=col)
        for h in range(1, heads):  # where one KV head's channels end and the next one's begin
            for row in (1, 2):
                fig.add_vline(x=h * dim - 0.5, line=dict(color="white" if row == 1 else "#bbbbbb", width=1, dash="dot"),
                              row=row, col=col)
    top = max(float(e.max()) for kinds in errors.values() for e in kinds.values())
    fig.update_yaxes(autorange="reversed", title_text="token", row=1, col=1)
    fig.update_yaxes(autorange="reversed", row=1, col=2)
    fig.update_yaxes(title_text="mean |error|", range=[0, 1.05 * top], row=2, col=1)
    fig.update_yaxes(range=[0, 1.05 * top], row=2, col=2)
    fig.update_xaxes(title_text=f"channel ({heads} KV heads x {dim})", row=2)
    fig.update_layout(
        title=title, width=FIGURE_WIDTH, height=640, legend=dict(LEGEND_BELOW, title="scales:"),
        coloraxis1=dict(colorscale="Viridis", cmin=0, colorbar=dict(x=0.455, len=0.55, y=0.78, thickness=10)),
        coloraxis2=dict(colorscale="Viridis", cmin=0, colorbar=dict(x=1.0, len=0.55, y=0.78, thickness=10)))
    return fig


def running_side_by_side(histories: dict[str, list[StepRecord]], num_requests: int,
                         title: str = "the same requests under each KV format") -> go.Figure:
    """One lifecycle panel per run (`LLM(record_steps=True)`'s `engine.history`), side by side on one y axis and one
    step axis: requests waiting, running and finished after each step, and a cross at each step that preempted."""
    names = list(histories)
    longest = max(len(h) for h in histories.values())
    preempted = {name: sum(r.num_preempted for r in h) for name, h in histories.items()}
    fig = make_subplots(rows=1, cols=len(names), shared_yaxes=True, horizontal_spacing=0.04,
                        subplot_titles=[f"{name}: {len(h)} steps, {preempted[name]} preemption"
                                        f"{'' if preempted[name] == 1 else 's'}" for name, h in histories.items()])
    for col, name in enumerate(names, start=1):
        panel = lifecycle_figure(histories[name], num_requests)
        for trace in panel.data:
            trace.legendgroup = trace.name
            trace.showlegend = col == 1 or trace.name == "a preemption"
            fig.add_trace(trace, row=1, col=col)
        fig.update_xaxes(title_text="engine step", range=[0, longest], row=1, col=col)
    seen = set()
    for trace in fig.data:  # the preemption marker once in the legend, whichever panel has it first
        if trace.name in seen:
            trace.showlegend = False
        elif trace.showlegend:
            seen.add(trace.name)
    fig.update_yaxes(title_text="requests", range=[0, num_requests * 1.08], row=1, col=1)
    fig.update_layout(title=title, width=FIGURE_WIDTH, height=400, legend=LEGEND_BELOW)
    return fig
