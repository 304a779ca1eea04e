"""Chapter 09's picture: what each verify pass of one request proposed, kept and added.

Reads `engine.spec.stats.log` (set it to [] before generating): one entry per verify,
(request_id, sample index, length before, proposal, tokens appended). Row i of the grid is
verify pass i: the proposed tokens, green where the target accepted them and red from the
first rejection on, then the one token the target adds itself (blue: a bonus after a fully
accepted proposal; orange: the correction that replaces the first rejected one).
"""
from __future__ import annotations

import plotly.graph_objects as go

STATUS = {"accepted": 1, "rejected": 2, "bonus": 3, "corrected": 4}
COLORS = ["#ffffff", "#2ca02c", "#d62728", "#1f77b4", "#ff7f0e"]


def _cells(entry):
    """(status, token id) for the proposal slots, then the target's own token."""
    *_, proposal, tokens = entry
    accepted = len(tokens) - 1
    cells = [("accepted" if j < accepted else "rejected", t) for j, t in enumerate(proposal)]
    return cells, ("bonus" if accepted == len(proposal) else "corrected", tokens[-1])


def spec_steps_figure(log, tokenizer, request_id: str | None = None, index: int = 0, max_steps: int = 24,
                      title: str | None = None) -> go.Figure:
    """The grid of verify passes for one request (the first logged one by default), revealed
    pass by pass with a slider."""
    rid = request_id if request_id is not None else log[0][0]
    entries = [e for e in log if e[0] == rid and e[1] == index][:max_steps]
    width = max(len(e[3]) for e in entries) + 1
    z, text, hover = [], [], []
    for e in entries:
        cells, (kind, token) = _cells(e)
        row_z = [STATUS[s] for s, _ in cells] + [0] * (width - 1 - len(cells)) + [STATUS[kind]]
        label = lambda t: tokenizer.decode([t]).replace("\n", "\\n")  # noqa: E731
        row_t = [label(t) for _, t in cells] + [""] * (width - 1 - len(cells)) + [label(token)]
        row_h = [f"{s}: {label(t)!r}" for s, t in cells] + [""] * (width - 1 - len(cells)) + [f"{kind}: {label(token)!r}"]
        z.append(row_z)
        text.append(row_t)
        hover.append(row_h)
    x = [f"proposal {j + 1}" for j in range(width - 1)] + ["target's token"]
    y = [f"pass {i + 1}" for i in range(len(entries))]
    colorscale = [[v / 4, c] for v, c in enumerate(COLORS)]

    def heatmap(upto):
        hidden = lambda rows, fill: [r if i <= upto else [fill] * width for i, r in enumerate(rows)]  # noqa: E731
        return go.Heatmap(z=hidden(z, None), text=hidden(text, ""), customdata=hidden(hover, ""), x=x, y=y,
                          texttemplate="%{text}", hovertemplate="%{y}, %{x}<br>%{customdata}<extra></extra>",
                          colorscale=colorscale, zmin=0, zmax=4, showscale=False, xgap=2, ygap=2)

    last = len(entries) - 1
    fig = go.Figure(data=[heatmap(last)], frames=[go.Frame(data=[heatmap(i)], name=str(i)) for i in range(len(entries))])
    accepted = sum(len(e[4]) - 1 for e in entries)
    proposed = sum(len(e[3]) for e in entries)
    emitted = sum(len(e[4]) for e in entries)
    fig.update_layout(
        title=title or f"request {rid}: {emitted} tokens in {len(entries)} passes; {accepted}/{proposed} proposals accepted",
        yaxis=dict(autorange="reversed"), height=120 + 28 * len(entries), margin=dict(l=70, r=20, t=60, b=90),
        sliders=[dict(active=last, currentvalue=dict(prefix="after pass "), pad=dict(t=40),
                      steps=[dict(label=str(i + 1), method="animate",
                                  args=[[str(i)], dict(mode="immediate", frame=dict(duration=0, redraw=True))])
                             for i in range(len(entries))])])
    return fig
