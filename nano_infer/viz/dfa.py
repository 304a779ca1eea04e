"""Chapter 07's pictures: a byte-level DFA drawn as a graph, walked one token at a time.

Nodes are DFA states, laid out left to right by their distance from the start; edges carry
the bytes that take one state to the next (ranges like 0-9, hex for non-ASCII bytes, so the
inside of a multi-byte character shows as a chain of hex edges). Node colour is how many
tokens the token index allows in that state. A walk step highlights the state before a
token and the byte edges the token's bytes follow, and lists the allowed tokens of that
state with the state each one leads to: the row of the index the mask is built from.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..constrained import ByteDFA, TokenIndex
from . import stepper

HIGHLIGHT = "#e6550d"
MAX_LISTED = 14  # allowed tokens listed in the table under the graph


def byte_label(b: int) -> str:
    """A byte as an edge label: printable ASCII as itself, space as ' ', anything else in hex."""
    if b == 0x20:
        return "' '"
    return chr(b) if 0x21 <= b <= 0x7E else f"{b:02X}"


def bytes_label(byte_values) -> str:
    """A set of bytes as short ranges ("0-9", "80-BF"); long lists are cut with a count."""
    values = sorted(byte_values)
    ranges: list[list[int]] = []
    for b in values:
        if ranges and ranges[-1][1] == b - 1:
            ranges[-1][1] = b
        else:
            ranges.append([b, b])
    parts = [byte_label(lo) if lo == hi else f"{byte_label(lo)}-{byte_label(hi)}" for lo, hi in ranges]
    if len(parts) > 3:
        return ",".join(parts[:2]) + f",… ({len(values)} bytes)"
    return ",".join(parts)


def spell(data: bytes | None) -> str:
    """What a token spells: the text if it is whole UTF-8, else its bytes (b'\\xe5')."""
    if data is None:
        return "(special)"
    try:
        return repr(data.decode("utf-8"))
    except UnicodeDecodeError:
        return repr(data)


def edges(dfa: ByteDFA) -> dict[tuple[int, int], list[int]]:
    """(from state, to state) -> the bytes that make that move."""
    src, byte = np.nonzero(dfa.transitions >= 0)
    out: dict[tuple[int, int], list[int]] = {}
    for s, b in zip(src.tolist(), byte.tolist()):
        out.setdefault((s, int(dfa.transitions[s, b])), []).append(b)
    return out


def layout(dfa: ByteDFA) -> np.ndarray:
    """[num_states, 2] positions: x = shortest distance from the start, y = order found at that distance."""
    depth = np.full(dfa.num_states, -1)
    depth[dfa.initial] = 0
    order = [dfa.initial]
    queue = deque(order)
    while queue:
        s = queue.popleft()
        for t in sorted(set(dfa.transitions[s][dfa.transitions[s] >= 0].tolist())):
            if depth[t] < 0:
                depth[t] = depth[s] + 1
                order.append(t)
                queue.append(t)
    pos = np.zeros((dfa.num_states, 2))
    for d in range(depth.max() + 1):
        column = [s for s in order if depth[s] == d]
        for i, s in enumerate(column):
            pos[s] = (d, (len(column) - 1) / 2 - i)
    return pos


@dataclass
class WalkStep:
    """One token of a walk through a token index (the last step of a walk has no token)."""

    state: int  # the state before the token
    token_id: int | None
    byte_states: list[int]  # the states the token's bytes pass through, starting at `state`
    allowed: np.ndarray  # token ids the index allows in `state` (EOS not included)
    eos_allowed: bool


def walk(index: TokenIndex, dfa: ByteDFA, token_ids: list[int]) -> list[WalkStep]:
    """The steps of reading `token_ids` from the start state, plus a final step after the last token.

    `dfa` must be the automaton the index was built from (same state numbering).
    Raises ValueError at the first token the index does not allow.
    """
    steps, state = [], index.initial
    for t in token_ids:
        nxt = index.next_state(state, t)
        if nxt < 0:
            raise ValueError(f"token {t} ({spell(index.token_bytes[t])}) is not allowed in state {state}")
        byte_states = [state]
        for byte in index.token_bytes[t] or b"":  # EOS spells nothing and keeps the state
            byte_states.append(int(dfa.transitions[byte_states[-1], byte]))
        steps.append(WalkStep(state, t, byte_states, index.allowed(state), bool(index.accepting[state])))
        state = nxt
    steps.append(WalkStep(state, None, [state], index.allowed(state), bool(index.accepting[state])))
    return steps


def dfa_figure(dfa: ByteDFA, index: TokenIndex, step: WalkStep | None = None, title: str = "") -> go.Figure:
    """The DFA as a graph; with a step, its token's byte path highlighted and the state's allowed tokens listed."""
    pos = layout(dfa)
    counts = np.diff(index.offsets)
    graph_px = 120 + 70 * (int(np.ptp(pos[:, 1])) + 1)
    table = _allowed_table(index, step) if step else None
    table_px = 40 + 28 * len(table.cells.values[0]) if step else 0
    fig = make_subplots(rows=2 if step else 1, cols=1, vertical_spacing=0.03,
                        row_heights=[graph_px, table_px] if step else None,
                        specs=[[{"type": "xy"}]] + ([[{"type": "table"}]] if step else []))
    path = set(zip(step.byte_states, step.byte_states[1:])) if step else set()
    labels = []  # (x, y, text) of each edge's bytes
    for (s, t), byte_values in edges(dfa).items():
        on_path = (s, t) in path
        (x0, y0), (x1, y1) = pos[s], pos[t]
        if s == t:  # self-loop: a label above the node
            labels.append((x0, y0 + 0.32, "↻ " + bytes_label(byte_values)))
            continue
        fig.add_annotation(x=x1, y=y1, ax=x0, ay=y0, xref="x", yref="y", axref="x", ayref="y", showarrow=True,
                           arrowhead=2, arrowsize=1, standoff=11, startstandoff=11,
                           arrowwidth=3 if on_path else 1, arrowcolor=HIGHLIGHT if on_path else "#999", row=1, col=1)
        labels.append(((x0 + x1) / 2, (y0 + y1) / 2 + 0.12, bytes_label(byte_values)))
    x, y, text = zip(*labels) if labels else ((), (), ())
    fig.add_trace(go.Scatter(x=x, y=y, text=text, mode="text", textfont=dict(size=10, color="#555"),
                             hoverinfo="skip", showlegend=False), row=1, col=1)
    hover = [f"state {s}: {counts[s]:,} tokens allowed" + (", accepting (EOS allowed)" if dfa.accepting[s] else "")
             for s in range(dfa.num_states)]
    border = ["#222" if a else "#bbb" for a in dfa.accepting]
    shade = np.log10(counts + 1)  # colour on a log scale: 1 token and 100k tokens both readable
    cmax = max(float(shade.max()), 1.0)
    ticks = [n for n in (0, 1, 10, 100, 1_000, 10_000, 100_000) if np.log10(n + 1) <= cmax]
    fig.add_trace(go.Scatter(
        x=pos[:, 0], y=pos[:, 1], mode="markers+text", text=[str(s) for s in range(dfa.num_states)],
        textfont=dict(size=9, color=["white" if v > 0.6 * cmax else "#222" for v in shade]),
        hovertext=hover, hoverinfo="text", showlegend=False,
        marker=dict(size=22, color=shade, colorscale="Blues", cmin=0, cmax=cmax,
                    line=dict(width=[3 if a else 1 for a in dfa.accepting], color=border),
                    colorbar=dict(title="allowed<br>tokens", len=graph_px / (graph_px + table_px), y=1, yanchor="top",
                                  tickvals=[np.log10(n + 1) for n in ticks], ticktext=[f"{n:,}" for n in ticks]))),
        row=1, col=1)
    if step:
        fig.add_trace(go.Scatter(x=[pos[step.state, 0]], y=[pos[step.state, 1]], mode="markers", hoverinfo="skip",
                                 marker=dict(size=32, color="rgba(0,0,0,0)", line=dict(width=3, color=HIGHLIGHT)),
                                 showlegend=False), row=1, col=1)
        fig.add_trace(table, row=2, col=1)
    fig.update_xaxes(visible=False, row=1, col=1)
    fig.update_yaxes(visible=False, row=1, col=1)
    sub = "node colour: tokens allowed in that state; thick border: accepting"
    if step:
        took = "the walk ends here" if step.token_id is None else \
            f"next token {step.token_id} {spell(index.token_bytes[step.token_id])} walks " + \
            " → ".join(map(str, step.byte_states))
        n = len(step.allowed)
        sub = f"state {step.state}: {n:,} token{'s' if n != 1 else ''} allowed" + \
              (" + EOS" if step.eos_allowed else "") + f"; {took}"
    fig.update_layout(title=f"{title}<br><sub>{sub}</sub>", height=90 + graph_px + table_px,
                      margin=dict(t=80, l=20, r=20, b=10), plot_bgcolor="white")
    return fig


def _allowed_table(index: TokenIndex, step: WalkStep) -> go.Table:
    """The state's row of the index: allowed tokens and where each leads; the walk's token first."""
    ids = step.allowed.tolist()
    if step.token_id is not None and step.token_id in ids:
        ids.remove(step.token_id)
        ids.insert(0, step.token_id)
    shown = ids[:MAX_LISTED]
    cells = [[str(t) for t in shown], [spell(index.token_bytes[t]) for t in shown],
             [str(index.next_state(step.state, t)) for t in shown]]
    if len(ids) > len(shown):
        cells = [c + [f"… {len(ids) - len(shown):,} more"] if i == 0 else c + [""] for i, c in enumerate(cells)]
    if step.eos_allowed:
        cells = [c + [v] for c, v in zip(cells, ["EOS", "(end of output)", "done"])]
    fill = ["rgba(230, 85, 13, 0.25)" if i == 0 and step.token_id is not None else "white" for i in range(len(cells[0]))]
    return go.Table(header=dict(values=["token id", "spells", "leads to state"], fill_color="#eee"),
                    cells=dict(values=cells, fill_color=[fill] * 3, align="left"))


def dfa_stepper(dfa: ByteDFA, index: TokenIndex, steps: list[WalkStep], title: str = "") -> go.Figure:
    """`dfa_figure` for every step of the walk in one figure, with a slider over the tokens read."""
    if not steps:
        raise ValueError("no steps to show")
    return stepper(lambda i: dfa_figure(dfa, index, steps[i], f"{title} · step {i}"), len(steps), "token", 900)
