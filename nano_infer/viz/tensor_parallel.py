"""Chapter 10's pictures: which slice of each weight every rank holds, and where a step's time goes."""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..distributed.shard import TPShard

RANK_COLORS = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#ff9da6", "#9d755d"]


def shard_spans(config, world_size: int) -> dict[str, list[tuple[int, int, int]]]:
    """{what is cut: [(rank, first, stop), ...]} in the units it is cut by (heads, features, vocabulary rows)."""
    spans: dict[str, list[tuple[int, int, int]]] = {"query heads": [], "KV heads": [], "MLP features": [],
                                                    "vocabulary rows": []}
    for rank in range(world_size):
        tp = TPShard(rank, world_size)
        q0, nq = tp.q_heads(config)
        k0, nk = tp.kv_heads(config)
        f0, nf = tp.features(config)
        spans["query heads"].append((rank, q0, q0 + nq))
        spans["KV heads"].append((rank, k0, k0 + nk))
        spans["MLP features"].append((rank, f0, f0 + nf))
        spans["vocabulary rows"].append((rank, *tp.vocab(config)))
    return spans


def shard_figure(config, sizes: tuple[int, ...] = (2, 4)) -> go.Figure:
    """One row per tensor-parallel size, one column per cut: a bar per rank over the slice it holds.
    A KV head held by several ranks (more ranks than KV heads) shows as stacked bars over the same span."""
    cuts = list(shard_spans(config, 1))
    fig = make_subplots(rows=len(sizes), cols=len(cuts), subplot_titles=[f"tp={s}: {c}" for s in sizes for c in cuts],
                        horizontal_spacing=0.06, vertical_spacing=0.18)
    for row, size in enumerate(sizes, start=1):
        for col, (cut, spans) in enumerate(shard_spans(config, size).items(), start=1):
            for rank, first, stop in spans:
                fig.add_bar(x=[stop - first], base=[first], y=[f"rank {rank}"], orientation="h",
                            marker_color=RANK_COLORS[rank % len(RANK_COLORS)], showlegend=False,
                            hovertemplate=f"rank {rank}: {cut} {first}..{stop - 1}<extra></extra>", row=row, col=col)
            fig.update_yaxes(autorange="reversed", row=row, col=col)
    fig.update_layout(title="what each rank holds of every layer (and of the embedding / LM head)",
                      height=200 + 60 * sum(sizes), barmode="overlay")
    return fig


def step_split_figure(rows: dict[str, tuple[float, float]]) -> go.Figure:
    """{label: (seconds computing, seconds in collectives)} per step -> stacked bars in ms."""
    labels = list(rows)
    fig = go.Figure()
    fig.add_bar(x=labels, y=[rows[k][0] * 1e3 for k in labels], name="compute (and Python)")
    fig.add_bar(x=labels, y=[rows[k][1] * 1e3 for k in labels], name="all-reduce / gather / step broadcast")
    fig.update_layout(barmode="stack", title="one decode step on the driver", yaxis_title="ms per step", height=380)
    return fig
