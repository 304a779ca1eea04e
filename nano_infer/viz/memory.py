"""Chapters 00-02's pictures: time per decode step, and KV memory reserved vs. used per engine step.

The memory figures read `engine.history` (`LLM(record_steps=True)`): one
`nano_infer.engine.memory.StepRecord` per step, taken after the step ran, with the bytes the
cache has set aside (`kv_reserved_bytes`) and the bytes holding a token's K/V
(`kv_used_bytes`).
"""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..engine.memory import StepRecord


def step_time_figure(curves: dict[str, tuple[list[int], list[float]]], title: str = "time per decode step") -> go.Figure:
    """One line per engine configuration: context length (tokens) -> seconds per step, drawn in ms."""
    fig = go.Figure()
    for name, (lengths, seconds) in curves.items():
        fig.add_scatter(x=list(lengths), y=[s * 1e3 for s in seconds], mode="lines+markers", name=name)
    fig.update_layout(title=title, xaxis_title="tokens in the sequence", yaxis_title="ms per step",
                      yaxis_rangemode="tozero", height=400)
    return fig


def kv_utilization(history: list[StepRecord]) -> float:
    """Used / reserved KV bytes summed over the recorded steps: the share of reserved memory doing work."""
    reserved = sum(r.kv_reserved_bytes for r in history)
    return sum(r.kv_used_bytes for r in history) / reserved if reserved else 1.0


def peak_reserved_bytes(history: list[StepRecord]) -> int:
    return max((r.kv_reserved_bytes for r in history), default=0)


def _unit(num_bytes: int) -> tuple[str, int]:
    for name, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if num_bytes >= size:
            return name, size
    return "bytes", 1


def kv_memory_figure(histories: dict[str, list[StepRecord]], title: str = "KV memory: reserved vs used") -> go.Figure:
    """Side by side, one panel per run of the same workload: reserved (gray) over used (blue) per step."""
    unit, size = _unit(max(peak_reserved_bytes(h) for h in histories.values()))
    names = list(histories)
    fig = make_subplots(rows=1, cols=len(names), shared_yaxes=True, horizontal_spacing=0.04,
                        subplot_titles=[f"{n}: {kv_utilization(histories[n]):.1%} used" for n in names])
    for col, name in enumerate(names, start=1):
        steps = [r.step for r in histories[name]]
        first = col == 1
        fig.add_scatter(x=steps, y=[r.kv_reserved_bytes / size for r in histories[name]], name="reserved",
                        fill="tozeroy", mode="lines", line_color="gray", legendgroup="reserved", showlegend=first,
                        row=1, col=col)
        fig.add_scatter(x=steps, y=[r.kv_used_bytes / size for r in histories[name]], name="used (holds a token)",
                        fill="tozeroy", mode="lines", line_color="#1f77b4", legendgroup="used", showlegend=first,
                        row=1, col=col)
        fig.update_xaxes(title_text="engine step", row=1, col=col)
    fig.update_yaxes(title_text=f"KV cache ({unit})", row=1, col=1)
    fig.update_layout(title=title, height=400)
    return fig
