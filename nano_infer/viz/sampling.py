"""Chapter 00's pictures: the next-token distribution before and after temperature / top-k / top-p.

The widget recomputes the distribution with the engine's own `apply_top_k_top_p`, so what
the sliders show is what `SamplingParams(temperature=, top_k=, top_p=)` samples from. It
needs a running kernel; `next_token_figure` is the same picture for fixed settings.
"""
from __future__ import annotations

import plotly.graph_objects as go
import torch

from ..engine.sampling import apply_top_k_top_p


def token_label(tokenizer, token_id: int) -> str:
    """A token as readable text: quoted, with spaces and newlines visible."""
    return repr(tokenizer.decode([token_id]))


def sampling_distribution(logits: torch.Tensor, temperature: float = 1.0, top_k: int = -1, top_p: float = 1.0) -> torch.Tensor:
    """Probabilities [V] the sampler draws from for one row of logits; temperature 0 is greedy (one-hot)."""
    logits = logits.detach().float().cpu().view(1, -1)
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float().view(-1)
    masked = apply_top_k_top_p(logits / temperature, torch.tensor([top_k]), torch.tensor([float(top_p)]))
    return masked.softmax(dim=-1).view(-1)


def next_token_figure(logits: torch.Tensor, tokenizer, temperature: float = 1.0, top_k: int = -1,
                      top_p: float = 1.0, num_tokens: int = 20) -> go.Figure:
    """Bars for the `num_tokens` most likely tokens: the model's softmax vs. what the sampler keeps."""
    logits = logits.detach().float().cpu().view(-1)
    raw = logits.softmax(-1)
    processed = sampling_distribution(logits, temperature, top_k, top_p)
    top = raw.topk(num_tokens).indices.tolist()
    labels = [f"{rank}: {token_label(tokenizer, t)}" for rank, t in enumerate(top)]  # unique x categories
    kept = int((processed > 0).sum())
    fig = go.Figure([
        go.Bar(x=labels, y=raw[top].tolist(), name="softmax(logits)", marker_color="lightgray"),
        go.Bar(x=labels, y=processed[top].tolist(), name="after temperature / top-k / top-p", marker_color="#1f77b4"),
    ])
    fig.update_layout(
        title=f"T={temperature:g}, top_k={top_k if top_k > 0 else 'off'}, top_p={top_p:g}: "
              f"{kept} of {logits.numel()} tokens can be sampled",
        barmode="group", yaxis_title="probability", xaxis_tickangle=-45, height=420,
        legend=dict(orientation="h", y=1.02, yanchor="bottom"), margin=dict(t=80),
    )
    return fig


def sampling_widget(logits: torch.Tensor, tokenizer, num_tokens: int = 20):
    """Sliders for temperature, top_k (0 = off) and top_p that recompute `next_token_figure` live.

    The figure is a plotly `FigureWidget` updated in place: no ipywidgets `Output`, whose
    display messages can leave nbclient waiting for a cell that has finished.
    """
    import ipywidgets as w

    # labels at their natural width (ipywidgets cuts a description to 80px by default)
    look = dict(style={"description_width": "initial"}, layout=w.Layout(width="32%"))
    temperature = w.FloatSlider(value=1.0, min=0.0, max=2.0, step=0.05, description="temperature",
                                readout_format=".2f", **look)
    top_k = w.IntSlider(value=0, min=0, max=num_tokens, description="top_k (0 = off)", **look)
    top_p = w.FloatSlider(value=1.0, min=0.05, max=1.0, step=0.05, description="top_p", readout_format=".2f", **look)

    def draw() -> go.Figure:
        k = top_k.value if top_k.value > 0 else -1
        return next_token_figure(logits, tokenizer, round(temperature.value, 2), k, round(top_p.value, 2), num_tokens)

    fig = go.FigureWidget(draw())

    def redraw(_=None):
        new = draw()
        with fig.batch_update():
            fig.data[1].y = new.data[1].y
            fig.layout.title = new.layout.title

    for slider in (temperature, top_k, top_p):
        slider.observe(redraw, names="value")
    return w.VBox([w.HBox([temperature, top_k, top_p]), fig])
