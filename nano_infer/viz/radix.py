"""The radix tree of `RadixPrefixCache` drawn with plotly, and a slider to step through its history.

Each node is a horizontal bar over the token positions its edge covers, so a bar's length
is the node's size in tokens and branches fan out where requests diverge. Colour tells
what eviction may do: locked nodes (a running request uses them) are untouchable,
unlocked leaves are next in line, unlocked inner nodes wait until their children go.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import plotly.graph_objects as go

from . import stepper

COLORS = {"locked": "#e6550d", "evictable leaf": "#6baed6", "unlocked inner": "#c6dbef"}


@dataclass
class NodeView:
    """A frozen copy of one RadixNode: the tree keeps changing, a snapshot must not."""

    key: int  # id() of the node, stable while the node lives
    parent: int | None  # None: a child of the root
    start: int  # token position where the node's edge begins
    end: int
    blocks: list[int]
    lock_ref: int
    last_access: int
    text: str
    is_leaf: bool

    @property
    def kind(self) -> str:
        if self.lock_ref > 0:
            return "locked"
        return "evictable leaf" if self.is_leaf else "unlocked inner"


@dataclass
class TreeSnapshot:
    title: str
    nodes: list[NodeView] = field(default_factory=list)
    num_free_blocks: int = 0

    @property
    def signature(self) -> tuple:
        """Equal for two snapshots that would draw the same picture."""
        return tuple((n.key, n.start, n.end, n.lock_ref) for n in self.nodes)


def snapshot(kv, decode=None, title: str = "") -> TreeSnapshot:
    """Copy the radix tree of a KVManager now (walks `kv.prefix_cache.nodes()`, parents before children).

    `decode(token_ids) -> str` labels the edges (e.g. `tokenizer.decode`); default: the ids.
    """
    views, cache = [], kv.prefix_cache
    for node in cache.nodes():
        text = decode(list(node.tokens)) if decode is not None else " ".join(map(str, node.tokens))
        views.append(NodeView(
            key=id(node), parent=None if node.parent is cache.root else id(node.parent),
            start=node.depth - len(node.tokens), end=node.depth, blocks=list(node.blocks),
            lock_ref=node.lock_ref, last_access=node.last_access, text=text, is_leaf=not node.children))
    return TreeSnapshot(title, views, kv.num_free_blocks)


def _rows(nodes: list[NodeView]) -> dict[int, float]:
    """Leaves on consecutive rows in depth-first order, each inner node centred over its children."""
    children: dict[int | None, list[NodeView]] = {}
    for n in nodes:
        children.setdefault(n.parent, []).append(n)
    rows: dict[int, float] = {}
    next_row = [0]

    def place(n: NodeView) -> float:
        kids = sorted(children.get(n.key, []), key=lambda c: c.text)
        if not kids:
            rows[n.key] = next_row[0]
            next_row[0] += 1
        else:
            rows[n.key] = sum(place(k) for k in kids) / len(kids)
        return rows[n.key]

    for n in sorted(children.get(None, []), key=lambda c: c.text):
        place(n)
    return rows


def tree_text(snap: TreeSnapshot) -> str:
    """The tree as indented text: one line per node with its edge, size and lock count."""
    children: dict[int | None, list[NodeView]] = {}
    for n in snap.nodes:
        children.setdefault(n.parent, []).append(n)
    lines = ["root"]

    def walk(parent, indent):
        for n in sorted(children.get(parent, []), key=lambda c: c.text):
            size = f"{n.end - n.start} tokens, blocks {n.blocks}, lock {n.lock_ref}"
            lines.append(f"{'  ' * indent}└─ {_short(n.text)!r}  [{size}]")
            walk(n.key, indent + 1)

    walk(None, 1)
    return "\n".join(lines)


def _short(text: str, width: int = 60) -> str:
    text = text.replace("\n", "⏎")
    return text if len(text) <= width else text[: width // 2] + " … " + text[-width // 2 :]


def tree_figure(snap: TreeSnapshot, max_tokens: int | None = None) -> go.Figure:
    """One snapshot: a bar per node from its first to its last token, lock counts on the bars."""
    rows = _rows(snap.nodes)
    fig = go.Figure()
    for kind, color in COLORS.items():
        nodes = [n for n in snap.nodes if n.kind == kind]
        fig.add_trace(go.Bar(
            name=kind, orientation="h", marker_color=color, marker_line=dict(color="#333", width=1),
            base=[n.start for n in nodes], x=[n.end - n.start for n in nodes], y=[rows[n.key] for n in nodes],
            text=[f"{n.end - n.start} tok" + (f" · lock {n.lock_ref}" if n.lock_ref else "") for n in nodes],
            textposition="inside", insidetextanchor="middle", width=0.6,
            customdata=[[n.start, n.end, str(n.blocks), n.lock_ref, n.last_access, _short(n.text)] for n in nodes],
            hovertemplate="tokens %{customdata[0]}–%{customdata[1]}, blocks %{customdata[2]}<br>"
                          "lock_ref %{customdata[3]}, last access %{customdata[4]}<br>%{customdata[5]}<extra></extra>",
            showlegend=True))
    # connectors: a vertical line where a child's edge leaves its parent's
    xs, ys = [], []
    root_children = [n for n in snap.nodes if n.parent is None]
    root_row = sum(rows[n.key] for n in root_children) / len(root_children) if root_children else 0
    for n in snap.nodes:
        parent_row = root_row if n.parent is None else rows[n.parent]
        xs += [n.start, n.start, None]
        ys += [parent_row, rows[n.key], None]
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line=dict(color="#333", width=1), hoverinfo="skip",
                             showlegend=False))
    fig.add_trace(go.Scatter(x=[0], y=[root_row], mode="markers+text", marker=dict(size=10, color="#333"),
                             text=["root"], textposition="middle left", hoverinfo="skip", showlegend=False))
    num_rows = max(rows.values(), default=0) + 1
    locked = sum(n.lock_ref > 0 for n in snap.nodes)
    held = sum(len(n.blocks) for n in snap.nodes)
    fig.update_layout(
        title=f"{snap.title}<br><sub>{len(snap.nodes)} nodes ({locked} locked), {held} blocks in the tree, "
              f"{snap.num_free_blocks} free</sub>",
        barmode="overlay", xaxis_title="token position", height=200 + 36 * num_rows, margin=dict(t=80, l=60),
        yaxis=dict(visible=False, range=[-0.7, num_rows - 0.3]), legend=dict(orientation="h", y=-0.25),
        xaxis=dict(range=[-max(4, (max_tokens or 0) * 0.04), max_tokens]) if max_tokens else {})
    return fig


def tree_stepper(snapshots: list[TreeSnapshot]) -> go.Figure:
    """`tree_figure` for every snapshot in one figure with a slider (same x range throughout)."""
    if not snapshots:
        raise ValueError("no snapshots to step through")
    max_tokens = max((n.end for s in snapshots for n in s.nodes), default=1) + 1
    return stepper(lambda i: tree_figure(snapshots[i], max_tokens), len(snapshots), "snapshot", 700)


def record_tree(kv, decode=None):
    """An `on_step(engine, outputs)` callback for `bench.prefix.run_staggered` and the list it fills.

    It snapshots the tree after every engine step whose picture differs from the last one,
    titled with the step, the running requests and the ones that just finished.
    """
    snaps: list[TreeSnapshot] = []

    def on_step(engine, outputs):
        running = sorted({s.request_id for s in engine.scheduler.running})
        done = [o.request_id for o in outputs if o.finished]
        title = f"step {engine.num_steps}: running {', '.join(running) or '-'}"
        if done:
            title += f"; finished {', '.join(done)}"
        snap = snapshot(kv, decode, title)
        if not snaps or snap.signature != snaps[-1].signature:
            snaps.append(snap)

    return on_step, snaps
