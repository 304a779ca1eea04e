"""Prefix-cache measurements drawn with plotly (notebooks 03 and 04); the tree itself is in `viz.radix`."""
from __future__ import annotations

import plotly.graph_objects as go


def ttft_figure(rows: list[dict], baseline: str) -> go.Figure:
    """Median TTFT vs shared-prefix length per engine (rows from `bench.prefix.ttft_vs_prefix_length`).

    Each cached engine also gets a dotted line at baseline TTFT / ideal speedup: where it
    would be if time to first token were proportional to the prompt tokens computed.
    """
    fig = go.Figure()
    engines = list(dict.fromkeys(r["engine"] for r in rows))
    base = {r["shared prefix tokens"]: r["median TTFT ms"] for r in rows if r["engine"] == baseline}
    for engine in engines:
        mine = [r for r in rows if r["engine"] == engine]
        xs = [r["shared prefix tokens"] for r in mine]
        fig.add_trace(go.Scatter(x=xs, y=[r["median TTFT ms"] for r in mine], mode="lines+markers", name=engine))
        if engine != baseline:
            fig.add_trace(go.Scatter(x=xs, y=[base[x] / r["ideal speedup"] for x, r in zip(xs, mine)],
                                     mode="lines", line=dict(dash="dot"), name=f"{engine}: ideal"))
    fig.update_layout(title="time to first token vs shared prefix length (median per length)",
                      xaxis_title="shared prefix (tokens)", yaxis_title="median TTFT (ms)", height=420)
    return fig


def cached_tokens_figure(records: list, title: str = "prompt tokens per request") -> go.Figure:
    """Stacked bars per request: prompt tokens served from the cache, and prompt tokens computed.

    `records` are the `RequestRecord`s of one `bench.prefix.run_workload`, in request order.
    """
    xs = [f"#{i}" for i in range(len(records))]
    fig = go.Figure([
        go.Bar(x=xs, y=[r.cached_tokens for r in records], name="from the cache", marker_color="#31a354"),
        go.Bar(x=xs, y=[r.prefill_tokens for r in records], name="computed (prefill)", marker_color="#de2d26"),
    ])
    fig.update_layout(title=title, barmode="stack", xaxis_title="request (in order)", yaxis_title="prompt tokens",
                      height=360)
    return fig
