"""Chapter 02's pictures: the paged KV pool as a grid of physical blocks, one row per sequence.

A cell is filled where a sequence's block table holds that physical block; its text is
the block's position in the table (logical block index) and its colour the block's
reference count, so a fork shows up as one column filled in several rows (orange or
red), and copy-on-write as the last column of a child moving to a fresh block. The top
row is the whole pool: every block's reference count, 0 = on the free list.
"""
from __future__ import annotations

import plotly.graph_objects as go

from ..kv.block_manager import BlockEvent
from ..engine.memory import StepRecord
from . import stepper

REF_COLORS = ["#eeeeee", "#1f77b4", "#ff7f0e", "#d62728"]  # ref count 0, 1, 2, 3+


def _colorscale(zmax: int) -> list:
    """Discrete colours for integer z in [0, zmax] (heatmap zmin=-0.5, zmax=zmax+0.5)."""
    scale = []
    for v in range(zmax + 1):
        color = REF_COLORS[min(v, len(REF_COLORS) - 1)]
        scale += [[v / (zmax + 1), color], [(v + 1) / (zmax + 1), color]]
    return scale


def blocks_in_use(history: list[StepRecord]) -> int:
    """1 + the highest physical block any recorded step touched: how many columns are worth drawing."""
    used = [b for r in history for table in r.block_tables.values() for b in table]
    used += [b for r in history for b, n in enumerate(r.ref_counts) if n]
    return max(used, default=-1) + 1


def _seq_order(key: str) -> tuple:
    request_id, index = key.rsplit("/", 1)
    return (int(request_id) if request_id.isdigit() else request_id, int(index))


def block_table_figure(record: StepRecord, num_blocks: int | None = None, zmax: int = 3) -> go.Figure:
    """Heatmap of one StepRecord: pool row (ref counts), then one row per running sequence."""
    num_blocks = num_blocks or len(record.ref_counts)
    refs = record.ref_counts[:num_blocks]
    seqs = sorted(record.block_tables, key=_seq_order)
    rows, text, hover = [refs], [[str(n) for n in refs]], [[f"block {b}: ref count {n}" for b, n in enumerate(refs)]]
    for key in seqs:
        where = {b: i for i, b in enumerate(record.block_tables[key]) if b < num_blocks}
        rows.append([refs[b] if b in where else None for b in range(num_blocks)])
        text.append([str(where[b]) if b in where else "" for b in range(num_blocks)])
        hover.append([f"seq {key}: block {b} = logical block {where[b]}, ref count {refs[b]}" if b in where else ""
                      for b in range(num_blocks)])
    labels = ["pool (ref count)"] + [f"seq {k}" for k in seqs]
    zmax = max([zmax] + refs)
    fig = go.Figure(go.Heatmap(
        z=rows, y=labels, x=list(range(num_blocks)), text=text, texttemplate="%{text}", hovertext=hover,
        hoverinfo="text", colorscale=_colorscale(zmax), zmin=-0.5, zmax=zmax + 0.5, xgap=2, ygap=2,
        colorbar=dict(title="ref count", tickvals=list(range(zmax + 1))),
    ))
    steps = ", ".join(f"{rid}/{i} {kind} {n}" for rid, i, n, kind in record.scheduled)
    fig.update_layout(
        title=f"step {record.step}: {len(seqs)} running, {record.num_free_blocks} free blocks<br><sub>ran: {steps}</sub>",
        xaxis_title="physical block id", yaxis_autorange="reversed", height=160 + 28 * len(labels),
        margin=dict(t=80), plot_bgcolor="white",
    )
    return fig


def block_table_stepper(history: list[StepRecord], num_blocks: int | None = None) -> go.Figure:
    """`block_table_figure` for every recorded step in one figure, with a slider over the engine steps."""
    num_blocks = num_blocks or blocks_in_use(history)
    return stepper(lambda i: block_table_figure(history[i], num_blocks), len(history), "engine step", 400,
                   labels=[str(r.step) for r in history])


def block_events_figure(log: list[BlockEvent]) -> go.Figure:
    """The BlockManager's allocation log: free blocks after each event, one marker colour per operation."""
    colors = {"alloc": "#1f77b4", "share": "#ff7f0e", "cow": "#d62728", "free": "#2ca02c", "evict": "#9467bd"}
    fig = go.Figure()
    fig.add_scatter(x=list(range(len(log))), y=[e.num_free_blocks for e in log], mode="lines",
                    line_color="lightgray", name="free blocks", hoverinfo="skip")
    for op, color in colors.items():
        idx = [i for i, e in enumerate(log) if e.op == op]
        if idx:
            fig.add_scatter(
                x=idx, y=[log[i].num_free_blocks for i in idx], mode="markers", marker_color=color, name=op,
                hovertext=[f"{op}: seq {log[i].seq_id}, block {log[i].block_id}, ref count {log[i].ref_count}" for i in idx],
                hoverinfo="text")
    fig.update_layout(title="BlockManager log: every alloc / share / copy-on-write / free",
                      xaxis_title="event", yaxis_title="free blocks", height=380)
    return fig
