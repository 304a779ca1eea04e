"""Chapter 13's figures: a matmul's time against the batch under its two roofs, and a card's memory split
between weights and K/V."""
from __future__ import annotations

import plotly.graph_objects as go

from . import FIGURE_WIDTH, LEGEND_BELOW


def roofline_figure(batches: list[int], measured_ms: list[float], memory_ms: float, compute_ms: list[float],
                    title: str) -> go.Figure:
    """Measured ms per step at each batch size, beside the two floors: reading the weights once (flat) and the
    FLOPs at the machine's matmul peak (growing with the batch). A step can beat neither."""
    floor = [max(memory_ms, c) for c in compute_ms]
    fig = go.Figure()
    fig.add_scatter(x=batches, y=[memory_ms] * len(batches), mode="lines", name="weights / bandwidth",
                    line=dict(color="#3182bd", dash="dot"))
    fig.add_scatter(x=batches, y=compute_ms, mode="lines", name="FLOPs / matmul peak", line=dict(color="#fd8d3c", dash="dot"))
    fig.add_scatter(x=batches, y=floor, mode="lines", name="the roofline (the larger floor)", line=dict(color="#636363"))
    fig.add_scatter(x=batches, y=measured_ms, mode="lines+markers", name="measured", line=dict(color="#d62728"))
    fig.update_layout(title=title, height=420, width=FIGURE_WIDTH, legend=LEGEND_BELOW,
                      xaxis=dict(type="log", title="rows in the batch", tickvals=batches),
                      yaxis=dict(type="log", title="ms per step"))
    return fig


def card_figure(rows: list[dict], card_bytes: int, title: str) -> go.Figure:
    """One stacked bar per weight format: the weights, the K/V of the sequences that fit, what is left over.
    `rows`: name, weight_bytes, kv_bytes (of the whole sequences that fit)."""
    gib = 2**30
    names = [r["name"] for r in rows]
    fig = go.Figure()
    fig.add_bar(x=names, y=[r["weight_bytes"] / gib for r in rows], name="weights", marker_color="#636363")
    fig.add_bar(x=names, y=[r["kv_bytes"] / gib for r in rows], name="K/V of the sequences that fit",
                marker_color="#3182bd", text=[f"{r['sequences']} sequences" for r in rows], textposition="inside")
    fig.add_bar(x=names, y=[(card_bytes - r["weight_bytes"] - r["kv_bytes"]) / gib for r in rows],
                name="left over (less than one sequence)", marker_color="#deebf7")
    fig.update_layout(barmode="stack", title=title, height=420, width=700, yaxis=dict(title="GiB", range=[0, card_bytes / gib]))
    return fig


def sizes_figure(names: list[str], floor_ms: list[float], matmul_ms: list[float], steps: dict[str, list[float | None]],
                 title: str) -> go.Figure:
    """Per model size, ms per token: the floor (the bytes as stored over the bandwidth), the step's matmuls
    alone, and each whole decode step measured (`steps`: label -> one value per size, None where not measured)."""
    fig = go.Figure()
    fig.add_bar(x=names, y=floor_ms, name="floor: bytes as stored / bandwidth", marker_color="#9ecae1")
    fig.add_bar(x=names, y=matmul_ms, name="the step's int4 matmuls alone", marker_color="#3182bd")
    for (label, values), color in zip(steps.items(), ("#d62728", "#fd8d3c", "#31a354")):
        fig.add_bar(x=names, y=values, name=label, marker_color=color)
    fig.update_layout(barmode="group", title=title, height=420, width=FIGURE_WIDTH, legend=LEGEND_BELOW,
                      yaxis=dict(type="log", title="ms per token (one thread)"))
    return fig
