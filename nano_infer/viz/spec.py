"""Chapter 09's picture: what each verify pass of one request proposed, kept and added.

Reads `engine.plugin(SpeculativeDecoder).stats.log` (set it to [] before generating): one entry per verify,
(request_id, sample index, length before, proposal, tokens appended, proposals accepted). Row
i of the grid is verify pass i: the proposed tokens, green where the target accepted them and
red from the first rejection on, then the one token the target adds itself (blue: a bonus
after a fully accepted proposal; orange: the correction that replaces the first rejected one).
Where an accepted token ended the request (an end-of-turn token), the proposals after it and
the target's token were never emitted: gray, and an empty last cell.
"""
from __future__ import annotations

import plotly.graph_objects as go

STATUS = {"accepted": 1, "rejected": 2, "bonus": 3, "corrected": 4, "not emitted": 5}
COLORS = ["#ffffff", "#2ca02c", "#d62728", "#1f77b4", "#ff7f0e", "#c7c7c7"]
LEGEND = {"accepted": "accepted proposal", "rejected": "rejected proposal", "bonus": "target's bonus token",
          "corrected": "target's correction", "not emitted": "after the end: never emitted"}


def _cells(entry):
    """(status, token id) for the proposal slots, then the target's own token (None if never emitted)."""
    *_, proposal, appended, accepted = entry
    cells = [("accepted" if j < accepted else "rejected", t) if j < len(appended) or j >= accepted
             else ("not emitted", t) for j, t in enumerate(proposal)]
    if len(appended) <= accepted:  # an accepted token ended the request: the target's own token never came
        return cells, None
    return cells, ("bonus" if accepted == len(proposal) else "corrected", appended[-1])


def spec_steps_figure(log, tokenizer, request_id: str | None = None, index: int = 0, max_steps: int = 24,
                      title: str | None = None) -> go.Figure:
    """The grid of verify passes for one request (the first logged one by default), revealed
    pass by pass with a slider."""
    rid = request_id if request_id is not None else log[0][0]
    entries = [e for e in log if e[0] == rid and e[1] == index][:max_steps]
    width = max(len(e[3]) for e in entries) + 1
    z, text, hover = [], [], []
    label = lambda t: tokenizer.decode([t]).replace("\n", "\\n")  # noqa: E731
    for e in entries:
        cells, own = _cells(e)
        pad = width - 1 - len(cells)
        row_z = [STATUS[s] for s, _ in cells] + [0] * pad + [STATUS[own[0]] if own else 0]
        row_t = [label(t) for _, t in cells] + [""] * pad + [label(own[1]) if own else ""]
        row_h = [f"{s}: {label(t)!r}" for s, t in cells] + [""] * pad + [f"{own[0]}: {label(own[1])!r}" if own else ""]
        z.append(row_z)
        text.append(row_t)
        hover.append(row_h)
    x = [f"proposal {j + 1}" for j in range(width - 1)] + ["target's token"]
    y = [f"pass {i + 1}" for i in range(len(entries))]
    top = len(COLORS) - 1
    colorscale = [[v / top, c] for v, c in enumerate(COLORS)]

    def heatmap(upto):
        hidden = lambda rows, fill: [r if i <= upto else [fill] * width for i, r in enumerate(rows)]  # noqa: E731
        return go.Heatmap(z=hidden(z, None), text=hidden(text, ""), customdata=hidden(hover, ""), x=x, y=y,
                          texttemplate="%{text}", hovertemplate="%{y}, %{x}<br>%{customdata}<extra></extra>",
                          colorscale=colorscale, zmin=0, zmax=top, showscale=False, xgap=2, ygap=2)

    last = len(entries) - 1
    # the colour legend: one empty trace per status, after the grid (frames replace the grid only)
    legend = [go.Scatter(x=[None], y=[None], mode="markers", name=LEGEND[k],
                         marker=dict(symbol="square", size=12, color=COLORS[v])) for k, v in STATUS.items()]
    fig = go.Figure(data=[heatmap(last), *legend],
                    frames=[go.Frame(data=[heatmap(i)], traces=[0], name=str(i)) for i in range(len(entries))])
    accepted = sum(e[5] for e in entries)
    proposed = sum(len(e[3]) for e in entries)
    emitted = sum(len(e[4]) for e in entries)
    fig.update_layout(
        title=title or f"request {rid}: {emitted} tokens in {len(entries)} passes; {accepted}/{proposed} proposals accepted",
        yaxis=dict(autorange="reversed"), height=150 + 28 * len(entries), margin=dict(l=70, r=20, t=90, b=90),
        legend=dict(orientation="h", y=1.02, yanchor="bottom", x=0), plot_bgcolor="white",
        sliders=[dict(active=last, currentvalue=dict(prefix="after pass "), pad=dict(t=40),
                      steps=[dict(label=str(i + 1), method="animate",
                                  args=[[str(i)], dict(mode="immediate", frame=dict(duration=0, redraw=True))])
                             for i in range(len(entries))])])
    return fig
