"""Chapter 12's picture: KV blocks moving between the device pool and the host tier, step by step.

`TierRecorder` wraps a running engine (any number of `generate` calls inside a `with` block) and
keeps, after every engine step, the state of every device block and every host block, and the
copies that step ran before its forward pass. `tier_stepper` draws them with a slider: the
device pool on top and the host tier below, one cell per block, coloured by state, with the request
that holds it written in it:

- device: free, used by a running sequence, or cached idle (only the prefix cache holds it:
  the next eviction's candidates);
- host: free, a cached prefix block (in the tier's index, found by a later match), or part of a
  preempted sequence swapped out whole.

Arrows are the step's copies: device -> host for evicted blocks offloaded (and swap-outs), host
-> device for prefix blocks loaded back (and swap-ins). The copies are captured by wrapping the
offloader plug-in's `adjust`, which takes them from the tier just before the forward pass: the
wrapper reads them from the tier's pending lists first, where each says whether it is a swap.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import plotly.graph_objects as go

from ..kv.host_tier import HostTierStats
from ..core.utils import cdiv
from . import FIGURE_WIDTH, stepper

# states of a block, the values the heatmaps colour
FREE, RUNNING, CACHED, HOST_CACHED, SWAPPED = range(5)
STATE_NAMES = ["free", "used by a sequence", "cached, idle (device)", "cached (host tier)", "swapped out (host)"]
STATE_COLORS = ["#eeeeee", "#1f77b4", "#9ecae1", "#fdae6b", "#d62728"]
MOVE_COLORS = {"offload": "#e6550d", "swap out": "#a50f15", "load": "#31a354", "swap in": "#006d2c"}


@dataclass
class TierSnapshot:
    """The two tiers after one engine step, and the copies that step ran."""

    step: int
    device: list[int]  # state of every device block (FREE, RUNNING, CACHED)
    host: list[int]  # state of every host block (FREE, HOST_CACHED, SWAPPED)
    device_owner: dict[int, str] = field(default_factory=dict)  # device block -> request ids reading it
    host_owner: dict[int, str] = field(default_factory=dict)  # swapped host block -> its request id
    offloads: list[tuple[int, int]] = field(default_factory=list)  # (device, host): an evicted block kept
    swap_outs: list[tuple[int, int]] = field(default_factory=list)  # (device, host): a preempted sequence's block
    loads: list[tuple[int, int]] = field(default_factory=list)  # (host, device): a prefix hit copied back
    swap_ins: list[tuple[int, int]] = field(default_factory=list)  # (host, device): a swapped sequence back
    scheduled: list[tuple[str, int, str]] = field(default_factory=list)  # (request id, tokens, prefill | decode)
    preempted: list[str] = field(default_factory=list)  # request ids preempted while scheduling this step
    stats: HostTierStats = field(default_factory=HostTierStats)  # the tier's counters after the step

    def count(self, state: int) -> int:
        return (self.host if state in (HOST_CACHED, SWAPPED) else self.device).count(state)

    @property
    def num_moved(self) -> int:
        return len(self.offloads) + len(self.swap_outs) + len(self.loads) + len(self.swap_ins)


def device_states(kv) -> list[int]:
    """FREE, RUNNING or CACHED for every device block of a KVManager: a block the prefix cache holds
    with no other reference is idle (evictable); any other reference is a running sequence's."""
    states = []
    for block, refs in enumerate(kv.ref_count):
        if refs == 0:
            states.append(FREE)
        elif refs == 1 and kv.holds(block):
            states.append(CACHED)
        else:
            states.append(RUNNING)
    return states


def host_states(tier) -> list[int]:
    """FREE, SWAPPED (held by a preempted sequence: a reference beyond the index's) or HOST_CACHED (in the
    tier's prefix index only). Read between steps, when no load holds a block."""
    return [FREE if refs == 0 else SWAPPED if refs > (block in tier.block_key) else HOST_CACHED
            for block, refs in enumerate(tier.ref_count)]


class TierRecorder:
    """`with TierRecorder(engine) as rec:` run requests on the engine; `rec.snapshots` has one TierSnapshot
    per engine step. The engine's own methods are restored on exit."""

    def __init__(self, engine):
        if engine.offloader is None:
            raise ValueError("TierRecorder draws the host tier: the engine has none (set kv_offloading_size > 0)")
        self.engine = engine
        self.snapshots: list[TierSnapshot] = []
        self._moves: dict[str, list[tuple[int, int]]] = {}
        self._scheduled: list[tuple[str, int, str]] = []
        self._preempted: list[str] = []

    def __enter__(self) -> TierRecorder:
        engine, offloader = self.engine, self.engine.offloader
        adjust, step = offloader.adjust, engine.step

        def recording_adjust(step):
            self._moves = self._pending()
            self._scheduled = [(e.seq.request_id, e.num_tokens, e.kind) for e in step.batch.scheduled]
            self._preempted = [s.request_id for s in step.batch.preempted]
            return adjust(step)

        def recording_step():
            self._moves, self._scheduled, self._preempted = {}, [], []
            outputs = step()
            if self._scheduled:  # a step that scheduled nothing ran nothing
                self.snapshots.append(self._snapshot())
            return outputs

        offloader.adjust, engine.step = recording_adjust, recording_step
        return self

    def __exit__(self, *exc) -> None:
        del self.engine.offloader.adjust, self.engine.step  # the instance attributes: the class's methods again

    def _pending(self) -> dict[str, list[tuple[int, int]]]:
        """The copies the tier queued for this step, split by kind (each pending copy says whether it
        belongs to a swap) before `take_transfers` hands them over."""
        tier = self.engine.kv.tier
        out = [(device, host, swap) for host, (device, swap) in tier.pending_out.items()]
        into = [(host, device, swap) for device, (host, swap) in tier.pending_in.items()]
        return {"offloads": [(d, h) for d, h, swap in out if not swap], "swap_outs": [(d, h) for d, h, swap in out if swap],
                "loads": [(h, d) for h, d, swap in into if not swap], "swap_ins": [(h, d) for h, d, swap in into if swap]}

    def _snapshot(self) -> TierSnapshot:
        engine = self.engine
        kv, tier, scheduler = engine.kv, engine.kv.tier, engine.scheduler
        device_owner: dict[int, list[str]] = {}
        for seq in scheduler.running:
            for block in seq.block_table:
                device_owner.setdefault(block, []).append(seq.request_id)
        host_owner = {block: seq.request_id for seq in scheduler.waiting if seq.seq_id in tier.swapped
                      for block in tier.swapped[seq.seq_id].blocks}
        return TierSnapshot(
            step=engine.num_steps - 1, device=device_states(kv), host=host_states(tier),
            device_owner={b: ", ".join(sorted(set(r))) for b, r in device_owner.items()}, host_owner=host_owner,
            scheduled=list(self._scheduled), preempted=list(self._preempted),
            stats=HostTierStats(**vars(tier.stats)), **self._moves)


# -- drawing ---------------------------------------------------------------------------------------------------
def _colorscale() -> list:
    """One flat colour per state value 0..4 (heatmaps with zmin=-0.5, zmax=4.5)."""
    n, scale = len(STATE_COLORS), []
    for v, color in enumerate(STATE_COLORS):
        scale += [[v / n, color], [(v + 1) / n, color]]
    return scale


def _cell(block: int, columns: int, top: float) -> tuple[int, float]:
    """(x, y) of a block's cell in a grid of `columns` whose first row is at y=top."""
    return block % columns, top + block // columns


def _grid(states: list[int], columns: int, top: float, owners: dict[int, str], hover) -> go.Heatmap:
    """One tier as a heatmap: a cell per block, its colour the state, its text the request that holds it."""
    rows = cdiv(len(states), columns)
    z = [[None] * columns for _ in range(rows)]
    text = [[""] * columns for _ in range(rows)]
    hovers = [[""] * columns for _ in range(rows)]
    for block, state in enumerate(states):
        r, c = block // columns, block % columns
        z[r][c] = state
        text[r][c] = owners.get(block, "")
        hovers[r][c] = hover(block, state)
    return go.Heatmap(z=z, x=list(range(columns)), y=[top + r for r in range(rows)], text=text, texttemplate="%{text}",
                      textfont=dict(size=10, color="white"), hovertext=hovers, hoverinfo="text", colorscale=_colorscale(),
                      zmin=-0.5, zmax=len(STATE_COLORS) - 0.5, xgap=2, ygap=2, showscale=False)


def _arrow(kind: str, x0: float, y0: float, x1: float, y1: float) -> dict:
    return dict(x=x1, y=y1, ax=x0, ay=y0, xref="x", yref="y", axref="x", ayref="y", text="", showarrow=True,
                arrowhead=2, arrowsize=1.2, arrowwidth=1.6, arrowcolor=MOVE_COLORS[kind], opacity=0.85)


def tier_figure(snapshots: list[TierSnapshot], i: int, columns: int = 16, max_arrows: int = 32) -> go.Figure:
    """Snapshot i: the device pool (top grid) and the host tier (bottom grid), this step's copies as arrows."""
    snap = snapshots[i]
    device_rows, host_rows = cdiv(len(snap.device), columns), cdiv(len(snap.host), columns)
    host_top = device_rows + 1  # one empty row between the grids

    def device_hover(block, state):
        owner = f" ({snap.device_owner[block]})" if block in snap.device_owner else ""
        return f"device block {block}: {STATE_NAMES[state]}{owner}"

    def host_hover(block, state):
        owner = f" ({snap.host_owner[block]})" if block in snap.host_owner else ""
        return f"host block {block}: {STATE_NAMES[state]}{owner}"

    fig = go.Figure()
    fig.add_trace(_grid(snap.device, columns, 0, snap.device_owner, device_hover))
    fig.add_trace(_grid(snap.host, columns, host_top, snap.host_owner, host_hover))
    # the legend: one square marker per state, and one line per kind of copy
    for state, (name, color) in enumerate(zip(STATE_NAMES, STATE_COLORS)):
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=name, hoverinfo="skip",
                                 marker=dict(symbol="square", size=12, color=color, line=dict(width=1, color="#999"))))
    arrows, ends = [], {kind: ([], []) for kind in MOVE_COLORS}
    moves = [("offload", snap.offloads, False), ("swap out", snap.swap_outs, False),
             ("load", snap.loads, True), ("swap in", snap.swap_ins, True)]
    for kind, pairs, into in moves:
        for a, b in pairs:
            host, device = (a, b) if into else (b, a)
            dx, dy = _cell(device, columns, 0)
            hx, hy = _cell(host, columns, host_top)
            ends[kind][0].extend([dx, hx])
            ends[kind][1].extend([dy, hy])
            if len(arrows) < max_arrows:
                arrows.append(_arrow(kind, hx, hy, dx, dy) if into else _arrow(kind, dx, dy, hx, hy))
    for kind, (xs, ys) in ends.items():  # the cells at both ends of each copy, outlined in its colour
        fig.add_trace(go.Scatter(x=xs or [None], y=ys or [None], mode="markers", name=f"{kind} (this step)",
                                 hoverinfo="skip", marker=dict(symbol="square-open", size=15, color=MOVE_COLORS[kind],
                                                               line=dict(width=2.5))))
    more = snap.num_moved - len(arrows)
    labels = [dict(x=-0.6, y=-0.75, xref="x", yref="y", xanchor="left", showarrow=False,
                   text=f"<b>device pool</b>: {len(snap.device)} blocks", font=dict(size=12)),
              dict(x=-0.6, y=host_top - 0.75, xref="x", yref="y", xanchor="left", showarrow=False,
                   text=f"<b>host tier</b>: {len(snap.host)} blocks", font=dict(size=12))]
    if more > 0:
        labels.append(dict(x=columns - 0.5, y=host_top - 0.75, xref="x", yref="y", xanchor="right", showarrow=False,
                           text=f"(+{more} copies not drawn)", font=dict(size=11)))
    height = 230 + 34 * (device_rows + host_rows + 1)
    fig.update_layout(
        title=_title(snap), annotations=labels + arrows, height=height, width=FIGURE_WIDTH, plot_bgcolor="white",
        margin=dict(t=120, l=40, r=40), legend=dict(orientation="h", y=-0.02, yanchor="top", x=0, font=dict(size=11)),
        xaxis=dict(range=[-0.6, columns - 0.4], showticklabels=False, showgrid=False, zeroline=False),
        yaxis=dict(range=[host_top + host_rows - 0.4, -1.1], showticklabels=False, showgrid=False, zeroline=False))
    return fig


def _title(snap: TierSnapshot) -> str:
    ran = ", ".join(f"{rid} {kind} {n}" for rid, n, kind in snap.scheduled) or "nothing"
    moved = (f"offloaded {len(snap.offloads)}, loaded back {len(snap.loads)}, swapped out {len(snap.swap_outs)}, "
             f"swapped in {len(snap.swap_ins)}")
    held = (f"device: {snap.count(RUNNING)} used, {snap.count(CACHED)} cached idle, {snap.count(FREE)} free · "
            f"host: {snap.count(HOST_CACHED)} cached, {snap.count(SWAPPED)} swapped, {snap.host.count(FREE)} free")
    pre = f" · preempted: {', '.join(snap.preempted)}" if snap.preempted else ""
    return f"step {snap.step}: ran {ran}{pre}<br><sub>copies before the forward pass: {moved}<br>{held}</sub>"


def eventful(snapshots: list[TierSnapshot]) -> list[TierSnapshot]:
    """The steps worth a stop of the slider: those that copied blocks, preempted or prefilled, and the last
    one (a run of plain decode steps changes no cell's state)."""
    return [s for i, s in enumerate(snapshots) if s.num_moved or s.preempted or i == len(snapshots) - 1
            or any(kind == "prefill" for *_, kind in s.scheduled)]


def tier_stepper(snapshots: list[TierSnapshot], columns: int = 16) -> go.Figure:
    """`tier_figure` for every recorded step in one figure, with a slider over the engine steps."""
    if not snapshots:
        raise ValueError("tier_stepper: no snapshots (did the engine run a step inside the recorder?)")
    return stepper(lambda i: tier_figure(snapshots, i, columns), len(snapshots), "engine step", 600,
                   labels=[str(s.step) for s in snapshots])
