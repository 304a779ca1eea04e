"""Chapters 05-06's pictures: who runs in which engine step, and what each step costs.

The schedule figures read `engine.history` (`LLM(record_steps=True)`): each `StepRecord`
lists the step's `scheduled` work as (request_id, sample index, tokens, "prefill" |
"decode"). A prefill chunk of a request that has already produced tokens is a
*recompute*: the request was preempted and is rebuilding its KV cache.
"""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..engine.memory import StepRecord

COLORS = {"prefill": "#ff7f0e", "decode": "#2ca02c", "recompute": "#d62728"}
PALETTE = ["#1f77b4", "#9467bd", "#8c564b", "#e377c2"]


def _label(request_id: str, index: int) -> str:
    return request_id if index == 0 else f"{request_id}/{index}"


def classify(history: list[StepRecord]) -> list[list[tuple[str, int, str]]]:
    """Per step, (request label, tokens, "prefill" | "decode" | "recompute").

    A prefill of a request that has already decoded is a recompute after preemption.
    """
    decoded, out = set(), []
    for record in history:
        row = []
        for request_id, index, n, kind in record.scheduled:
            label = _label(request_id, index)
            if kind == "decode":
                decoded.add(label)
            elif label in decoded:
                kind = "recompute"
            row.append((label, n, kind))
        out.append(row)
    return out


def schedule_segments(history: list[StepRecord]) -> list[dict]:
    """One dict per bar of the Gantt chart: a prefill chunk, a recompute chunk, or a run of consecutive decode steps."""
    segments, open_decode = [], {}
    for record, row in zip(history, classify(history)):
        for label, n, kind in row:
            run = open_decode.get(label)
            if kind == "decode" and run is not None and run["end"] == record.step:  # continues the previous step's run
                run["end"] += 1
                run["tokens"] += 1
                continue
            run = dict(label=label, kind=kind, start=record.step, end=record.step + 1, tokens=n)
            if kind == "decode":
                open_decode[label] = run
            segments.append(run)
    return segments


def schedule_gantt(history: list[StepRecord], budget: int | None = None, title: str = "requests across engine steps") -> go.Figure:
    """Top: one row per request, a bar per prefill chunk (its token count written on it) and per run of
    decodes. Bottom: the tokens each step computed, by kind, against the token budget."""
    segments = schedule_segments(history)
    labels = list(dict.fromkeys(s["label"] for s in segments))  # first-scheduled order
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.05, row_heights=[0.72, 0.28],
                        subplot_titles=["one row per request", "tokens computed per step"])
    for kind, color in COLORS.items():
        mine = [s for s in segments if s["kind"] == kind]
        if not mine:
            continue
        fig.add_bar(
            y=[s["label"] for s in mine], x=[s["end"] - s["start"] for s in mine], base=[s["start"] for s in mine],
            orientation="h", marker=dict(color=color, line=dict(color="white", width=0.5)), name=kind,
            text=[str(s["tokens"]) if kind != "decode" else "" for s in mine], textposition="inside",
            hovertext=[f"{s['label']}: {kind} steps {s['start']}-{s['end'] - 1}, {s['tokens']} tokens" for s in mine],
            hoverinfo="text", legendgroup=kind, row=1, col=1)
    steps = [r.step for r in history]
    per_kind = {kind: [0] * len(history) for kind in COLORS}
    for i, row in enumerate(_kinds_per_step(history)):
        for kind, n in row.items():
            per_kind[kind][i] = n
    below = [0] * len(history)  # stacked by hand: the Gantt bars above need barmode "overlay"
    for kind, color in COLORS.items():
        if any(per_kind[kind]):
            fig.add_bar(x=[s + 0.5 for s in steps], y=per_kind[kind], base=list(below), marker_color=color, name=kind,
                        legendgroup=kind, showlegend=False, width=1.0, row=2, col=1)
            below = [b + n for b, n in zip(below, per_kind[kind])]
    if budget is not None:
        fig.add_hline(y=budget, line_dash="dash", line_color="gray", annotation_text=f"token budget {budget}",
                      annotation_position="top left", row=2, col=1)
    fig.update_yaxes(autorange="reversed", categoryorder="array", categoryarray=labels, title_text="request", row=1, col=1)
    fig.update_yaxes(title_text="tokens", row=2, col=1)
    fig.update_xaxes(title_text="engine step", row=2, col=1)
    fig.update_layout(title=title, barmode="overlay", height=260 + 18 * len(labels),
                      legend=dict(orientation="h", y=1.06, x=1, xanchor="right"))
    return fig


def _kinds_per_step(history: list[StepRecord]) -> list[dict[str, int]]:
    """Tokens per kind in each step."""
    out = []
    for row in classify(history):
        totals = {}
        for _, n, kind in row:
            totals[kind] = totals.get(kind, 0) + n
        out.append(totals)
    return out


def lifecycle_figure(history: list[StepRecord], num_requests: int, title: str = "request lifecycle") -> go.Figure:
    """Stacked per step: requests waiting, running and finished (after the step ran)."""
    steps = [r.step for r in history]
    waiting = [r.num_waiting for r in history]
    running = [r.num_running for r in history]
    finished = [num_requests - w - r for w, r in zip(waiting, running)]
    fig = go.Figure()
    for name, values, color in (("finished", finished, "#7f7f7f"), ("running", running, "#2ca02c"), ("waiting", waiting, "#1f77b4")):
        fig.add_scatter(x=steps, y=values, name=name, stackgroup="requests", mode="lines", line=dict(width=0.5, color=color))
    preempted = [r.step for r in history if r.num_preempted]
    if preempted:
        fig.add_scatter(x=preempted, y=[num_requests] * len(preempted), mode="markers", name="a preemption",
                        marker=dict(symbol="x", color=COLORS["recompute"], size=9))
    fig.update_layout(title=title, xaxis_title="engine step", yaxis_title="requests", height=330)
    return fig


def attention_scaling_figure(rows: list[dict], title: str = "decode attention against context length") -> go.Figure:
    """rows: dicts with 'impl', 'context', 'ms' and 'mib' (the largest tensor one attention call allocates)."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=["time per call", "largest temporary tensor"], horizontal_spacing=0.1)
    for i, impl in enumerate(dict.fromkeys(r["impl"] for r in rows)):
        mine = sorted((r for r in rows if r["impl"] == impl), key=lambda r: r["context"])
        color = PALETTE[i % len(PALETTE)]
        x = [r["context"] for r in mine]
        fig.add_scatter(x=x, y=[r["ms"] for r in mine], name=impl, mode="lines+markers", line_color=color, legendgroup=impl, row=1, col=1)
        fig.add_scatter(x=x, y=[r["mib"] for r in mine], name=impl, mode="lines+markers", line_color=color, legendgroup=impl,
                        showlegend=False, row=1, col=2)
    fig.update_xaxes(title_text="context length (tokens per sequence)", type="log")
    fig.update_yaxes(title_text="ms", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="MiB", rangemode="tozero", row=1, col=2)
    fig.update_layout(title=title, height=400)
    return fig


def per_request_figure(values: dict[str, list[float]], y_title: str, title: str) -> go.Figure:
    """One marker per request and run (x: request in arrival order), e.g. the time to first token of each."""
    fig = go.Figure()
    for i, (name, ys) in enumerate(values.items()):
        fig.add_scatter(x=list(range(len(ys))), y=ys, mode="markers+lines", name=name,
                        line=dict(color=PALETTE[i % len(PALETTE)], width=1), marker=dict(size=6))
    fig.update_layout(title=title, xaxis_title="request (arrival order)", yaxis_title=y_title, yaxis_rangemode="tozero",
                      height=360)
    return fig
