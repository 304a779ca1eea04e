"""Chapter 08's pictures: concurrent streams on a timeline (TTFT, inter-token latency) over the
engine's batch size per step.

Clients record a `StreamTiming` each: when the request went out and when each piece of text
arrived, on `time.perf_counter()`, the clock the engine's `StepRecord`s use too, so both
share one time axis.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..engine.memory import StepRecord


@dataclass
class StreamTiming:
    name: str
    sent: float  # perf_counter() when the request went out
    arrivals: list[float] = field(default_factory=list)  # perf_counter() of every chunk that carried text
    left_early: bool = False  # the client disconnected before the end
    num_tokens: int = 0  # completion tokens, from the usage the server reports at the end

    @property
    def ttft(self) -> float | None:
        """Time to first token: what a user waits before anything appears."""
        return self.arrivals[0] - self.sent if self.arrivals else None

    @property
    def itls(self) -> list[float]:
        """Inter-token latencies: the gaps between consecutive chunks."""
        return [b - a for a, b in zip(self.arrivals, self.arrivals[1:])]

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first: one request's mean inter-token latency.
        Steadier than single gaps, which bunch up whenever the client or server falls behind."""
        tokens = self.num_tokens or len(self.arrivals)
        return (self.arrivals[-1] - self.arrivals[0]) / (tokens - 1) if tokens > 1 and self.arrivals else None


def latency_stats(streams: list[StreamTiming]) -> dict[str, float]:
    """Median and worst TTFT, median time per output token, p90 of single inter-token gaps; seconds."""
    ttfts = sorted(s.ttft for s in streams if s.ttft is not None)
    tpots = [s.tpot for s in streams if s.tpot is not None]
    itls = sorted(x for s in streams for x in s.itls)
    return {"ttft_median": statistics.median(ttfts), "ttft_max": ttfts[-1],
            "tpot_median": statistics.median(tpots) if tpots else 0.0,
            "itl_p90": itls[int(0.9 * (len(itls) - 1))] if itls else 0.0}


def latency_timeline(streams: list[StreamTiming], history: list[StepRecord] | None = None,
                     title: str = "concurrent streams") -> go.Figure:
    """One row per request: a thin line while it waits for its first token (TTFT), a dot per
    chunk received after that. Below, if `history` is given: sequences in each engine step,
    split into decodes and prefills, on the same time axis."""
    t0 = min(s.sent for s in streams)
    rows = 2 if history else 1
    fig = make_subplots(rows=rows, cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        row_heights=[0.7, 0.3] if history else [1.0],
                        subplot_titles=["requests: waiting for the first token (line), then each chunk (dot)"]
                        + (["sequences per engine step"] if history else []))
    for row, s in enumerate(streams):
        color = "#d62728" if s.left_early else "#1f77b4"
        if s.arrivals:
            tpot = f"{s.tpot * 1e3:.1f} ms" if s.tpot is not None else "-"
            hover = f"{s.name}<br>TTFT {s.ttft * 1e3:.0f} ms<br>time per output token {tpot}<br>{len(s.arrivals)} chunks"
            fig.add_scatter(x=[s.sent - t0, s.arrivals[0] - t0], y=[row, row], mode="lines", line=dict(color="lightgray", width=2),
                            hoverinfo="skip", showlegend=False, row=1, col=1)
            fig.add_scatter(x=[t - t0 for t in s.arrivals], y=[row] * len(s.arrivals), mode="markers",
                            marker=dict(color=color, size=4), name=s.name, hovertext=hover, hoverinfo="text",
                            showlegend=False, row=1, col=1)
    fig.add_scatter(x=[None], y=[None], mode="markers", marker_color="#1f77b4", name="chunk received", row=1, col=1)
    if any(s.left_early for s in streams):
        fig.add_scatter(x=[None], y=[None], mode="markers", marker_color="#d62728", name="client left early", row=1, col=1)
    fig.update_yaxes(title_text="request", autorange="reversed", row=1, col=1)
    if history:
        steps = [r for r in history if r.end >= t0]
        for kind, color in (("decode", "#2ca02c"), ("prefill", "#ff7f0e")):
            fig.add_bar(x=[(r.start + r.end) / 2 - t0 for r in steps], width=[r.end - r.start for r in steps],
                        y=[sum(1 for *_, k in r.scheduled if k == kind) for r in steps], name=f"{kind} sequences",
                        marker_color=color, marker_line_width=0, row=2, col=1)
        fig.update_layout(barmode="stack", bargap=0)
        fig.update_yaxes(title_text="batch size", row=2, col=1)
    fig.update_xaxes(title_text="seconds since the first request", row=rows, col=1)
    fig.update_layout(title=title, height=300 + 14 * len(streams) + (200 if history else 0),
                      legend=dict(orientation="h", y=-0.12 if history else -0.2))
    return fig


def batch_sizes(history: list[StepRecord], since: float = float("-inf")) -> list[int]:
    """Sequences computed in each engine step that started after `since`."""
    return [len(r.scheduled) for r in history if r.start >= since]
