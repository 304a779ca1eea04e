"""Chapter 11's picture: one beam-search request, round by round, as a tree beside its block tables.

`record_beam_search` drives an engine through one beam request and keeps, after every round,
each live beam (its sequence id, the beam it extends, its tokens and block table), the pool's
reference counts and the block operations of that step (the allocator's log). `beam_stepper`
draws the rounds with a slider: on the left the tree of hypotheses (x = output position, y = the
beam's rank; gray branches were pruned; a star is a finished hypothesis, in the row of the beam it
ended from, half a column after it), on the right each live
beam's block table as a row of cells, the physical block id written in the cell and its colour
the block's reference count, so the prompt's blocks read by all k beams stand out, and a cell
outlined in black is a copy-on-write made in that step.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import plotly.graph_objects as go
from plotly.colors import sample_colorscale
from plotly.subplots import make_subplots

from ..beam import BeamSearcher
from ..kv.block_manager import BlockEvent
from . import FIGURE_WIDTH, stepper


@dataclass
class BeamView:
    seq_id: int
    parent: int | None  # seq_id of the beam this one extends this round (itself when extended in place)
    rank: int  # 0 = the most likely live beam
    tokens: list[int]  # output tokens so far
    cum_logprob: float
    block_table: list[int]


@dataclass
class Finished:
    tokens: list[int]  # output tokens, the final EOS included
    score: float
    finish_reason: str
    parent: int | None  # seq_id of the beam it ended from


@dataclass
class BeamRound:
    step: int  # the engine step that decided this round
    round: int  # output tokens every live beam has now
    beams: list[BeamView]  # live, best first; empty once the search is done
    finished: list[Finished]  # the best hypotheses so far, best first
    ref_counts: list[int]
    num_free_blocks: int
    events: list[BlockEvent] = field(default_factory=list)  # the allocator's operations in this step
    forks: list[tuple[int, int]] = field(default_factory=list)  # (parent seq_id, child seq_id)
    pruned: list[int] = field(default_factory=list)  # seq_ids of beams nobody extended
    done: bool = False

    @property
    def copies(self) -> list[tuple[int, int]]:
        """(seq_id, new block) of every copy-on-write in this step."""
        return [(e.seq_id, e.block_id) for e in self.events if e.op == "cow"]

    @property
    def freed_blocks(self) -> list[int]:
        """Blocks that went back to the free list in this step (their last reference dropped)."""
        return [e.block_id for e in self.events if e.op == "free" and e.ref_count == 0]


def record_beam_search(engine, request_id: str, params, prompt_token_ids: list[int]) -> list[BeamRound]:
    """Run one beam request alone on `engine` (an LLMEngine) and record every round it decides."""
    if engine.kv.blocks.log is None:
        engine.kv.blocks.log = []
    log = engine.kv.blocks.log
    engine.add_request(request_id, prompt_token_ids=prompt_token_ids, params=params)
    req = engine.requests[request_id]
    _, state = engine.plugin(BeamSearcher).searches[request_id]
    n = len(prompt_token_ids)
    rounds: list[BeamRound] = []
    before = {tuple(req.seqs[0].token_ids): req.seqs[0].seq_id}  # live beams' tokens -> seq_id
    seen = set()  # hypotheses already shown as finished
    while not state.done:
        start, num_generated = len(log), state.num_generated
        engine.step()
        if state.num_generated == num_generated and not state.done:
            continue  # the round is not decided yet (beams split across steps)
        live = [] if state.done else [b.seq for b in state.beams]
        beams = [BeamView(s.seq_id, before.get(tuple(s.token_ids[:-1])), rank, list(s.token_ids[n:]),
                          float(state.beams[rank].cum_logprob), list(s.block_table)) for rank, s in enumerate(live)]
        ids = {b.seq_id for b in beams}
        finished = []
        for h in state.finished:
            key = tuple(h.output_token_ids)
            parent = None if key in seen else before.get(tuple(prompt_token_ids) + key[:-1])
            finished.append(Finished(list(h.output_token_ids), float(h.score), h.finish_reason, parent))
        for f in finished:
            if f.parent is not None:
                seen.add(tuple(f.tokens))
        rounds.append(BeamRound(
            step=engine.num_steps - 1, round=state.num_generated, beams=beams, finished=finished,
            ref_counts=list(engine.kv.ref_count), num_free_blocks=engine.kv.num_free_blocks,
            events=list(log[start:]), forks=[(b.parent, b.seq_id) for b in beams if b.seq_id not in before.values()],
            pruned=[] if state.done else sorted(set(before.values()) - ids), done=state.done))
        before = {tuple(s.token_ids): s.seq_id for s in live}
    return rounds


def _colors(zmax: int) -> list:
    """Discrete colours for reference counts 1..zmax: light blue for a private block, then warmer."""
    palette = ["#9ecae1"] + sample_colorscale("OrRd", [0.35 + 0.65 * i / max(1, zmax - 2) for i in range(zmax - 1)])
    scale = []
    for v, color in enumerate(palette[:zmax]):
        scale += [[v / zmax, color], [(v + 1) / zmax, color]]
    return scale


def _short(text: str) -> str:
    text = text.replace("\n", "⏎")
    return text if len(text) <= 8 else text[:7] + "…"


def beam_round_figure(rounds: list[BeamRound], i: int, decode=None, width: int | None = None,
                      num_columns: int | None = None, zmax: int | None = None) -> go.Figure:
    """Round i: the beam tree up to it (left) and the live beams' block tables (right)."""
    decode = decode or (lambda ids: " ".join(map(str, ids)))
    width = width or max(len(r.beams) for r in rounds)
    num_columns = num_columns or max(len(b.block_table) for r in rounds for b in r.beams)
    zmax = zmax or max(max(r.ref_counts) for r in rounds)
    rec = rounds[i]
    fig = make_subplots(rows=1, cols=2, column_widths=[0.58, 0.42], shared_yaxes=True, horizontal_spacing=0.04)
    # the tree: a node per (round, live beam), an edge to the beam it extends. Blue: the live beams and
    # their ancestors (once done: the ancestors of the finished hypotheses), gray: branches that were pruned
    rank_of = [{b.seq_id: b.rank for b in r.beams} for r in rounds]
    ended = [(j, f) for j in range(i + 1) for f in rounds[j].finished if f.parent is not None]
    if rec.done:
        kept = {tuple(f.tokens) for f in rec.finished}
        frontier = [(j - 1, rank_of[j - 1][f.parent]) for j, f in ended if j and tuple(f.tokens) in kept]
    else:
        frontier = [(i, b.rank) for b in rec.beams]
    alive = set()
    while frontier:
        j, r = frontier.pop()
        if (j, r) in alive:
            continue
        alive.add((j, r))
        if j:
            frontier.append((j - 1, rank_of[j - 1][rounds[j].beams[r].parent]))
    last = i - 1 if rec.done else i
    edges = {True: ([], []), False: ([], [])}
    nodes = {True: ([], [], [], []), False: ([], [], [], [])}
    for j in range(last + 1):
        for b in rounds[j].beams:
            x, y = rounds[j].round, b.rank
            px, py = (rounds[j - 1].round, rank_of[j - 1][b.parent]) if j else (0, 0)
            on = (j, b.rank) in alive
            edges[on][0].extend([px, x, None])
            edges[on][1].extend([py, y, None])
            label = decode(b.tokens[-1:])
            nodes[on][0].append(x)
            nodes[on][1].append(y)
            nodes[on][2].append(_short(label))
            nodes[on][3].append(f"seq {b.seq_id}, rank {b.rank}, cum logprob {b.cum_logprob:.2f}<br>{decode(b.tokens)!r}")
    hx, hy, ht, hh = [], [], [], []
    for j, f in ended:  # in the row of the beam it ended from, between that beam and the round it ended in
        hx.append(rounds[j].round - 0.5)
        hy.append(rank_of[j - 1][f.parent] if j else 0)
        ht.append(_short(decode(f.tokens[-1:])))
        hh.append(f"finished ({f.finish_reason}), score {f.score:.3f}<br>{decode(f.tokens)!r}")
    for on, color in ((False, "#c7c7c7"), (True, "#1f77b4")):
        fig.add_trace(go.Scatter(x=edges[on][0], y=edges[on][1], mode="lines", line=dict(color=color, width=1.5),
                                 hoverinfo="skip", showlegend=False), row=1, col=1)
    for on, color, name in ((False, "#c7c7c7", "pruned beam"), (True, "#1f77b4", "live beam / its ancestors")):
        fig.add_trace(go.Scatter(x=nodes[on][0] or [None], y=nodes[on][1] or [None], text=nodes[on][2], hovertext=nodes[on][3],
                                 mode="markers+text", textposition="top center", textfont=dict(size=9),
                                 marker=dict(size=7, color=color), hoverinfo="text", name=name), row=1, col=1)
    fig.add_trace(go.Scatter(x=hx or [None], y=hy or [None], text=ht, hovertext=hh, mode="markers", hoverinfo="text",
                             marker=dict(symbol="star", size=12, color="#2ca02c"), name="finished hypothesis"),
                  row=1, col=1)
    # the block tables: row = rank, column = logical block, text = physical block, colour = its ref count
    cows = {block for _, block in rec.copies}
    z, text, hover = [], [], []
    for r in range(width):
        b = rec.beams[r] if r < len(rec.beams) else None
        table = b.block_table if b else []
        z.append([rec.ref_counts[blk] for blk in table] + [None] * (num_columns - len(table)))
        text.append([str(blk) for blk in table] + [""] * (num_columns - len(table)))
        hover.append([f"seq {b.seq_id}: logical block {c} = block {blk}, ref count {rec.ref_counts[blk]}"
                      + (" (copied on write this step)" if blk in cows else "") for c, blk in enumerate(table)]
                     + [""] * (num_columns - len(table)))
    fig.add_trace(go.Heatmap(z=z, x=list(range(num_columns)), y=list(range(width)), text=text, texttemplate="%{text}",
                             hovertext=hover, hoverinfo="text", colorscale=_colors(zmax), zmin=0.5, zmax=zmax + 0.5,
                             xgap=2, ygap=2, colorbar=dict(title=dict(text="ref<br>count", side="top"), thickness=14,
                                                           tickvals=list(range(1, zmax + 1)), x=1.01, xpad=4)),
                  row=1, col=2)
    cx = [c for b in rec.beams for c, blk in enumerate(b.block_table) if blk in cows]
    cy = [b.rank for b in rec.beams for blk in b.block_table if blk in cows]
    fig.add_trace(go.Scatter(x=cx or [None], y=cy or [None], mode="markers", hoverinfo="skip", name="copy-on-write this step",
                             marker=dict(symbol="square-open", size=22, color="black", line=dict(width=2))), row=1, col=2)
    fig.update_layout(title=_title(rec), height=280 + 70 * width, width=FIGURE_WIDTH,
                      margin=dict(t=170, l=110, r=70), plot_bgcolor="white",
                      legend=dict(orientation="h", y=1.01, yanchor="bottom", x=0),
                      xaxis=dict(range=[-0.5, max(r.round for r in rounds) + 0.7], title="beams: output token", dtick=4),
                      xaxis2=dict(range=[-0.5, num_columns - 0.5], title="block tables: logical block (text: physical block)", dtick=1),
                      yaxis=dict(range=[width - 0.3, -0.6], tickvals=list(range(width)),
                                 ticktext=[f"rank {b.rank}: seq {b.seq_id}" for b in rec.beams]
                                 + [""] * (width - len(rec.beams))))
    return fig


def _blocks(ids: list[int]) -> str:
    """Block ids said as ids: "none", "block 10", "blocks 10, 12"."""
    return "none" if not ids else f"block{'s' if len(ids) > 1 else ''} {', '.join(map(str, ids))}"


def _title(rec: BeamRound) -> str:
    """Counted in rounds, as the slider is: one count per frame."""
    if rec.done:
        return (f"round {rec.round}: done; {len(rec.finished)} hypotheses, every beam's blocks freed "
                f"({rec.num_free_blocks} free)<br><sub>best: score {rec.finished[0].score:.3f}</sub>")
    forks = ", ".join(f"{p}→{c}" for p, c in rec.forks) or "none"
    cows = ", ".join(f"seq {s} → block {b}" for s, b in rec.copies) or "none"
    pruned = ", ".join(map(str, rec.pruned)) or "none"
    return (f"round {rec.round}: {len(rec.beams)} beams, {len(rec.finished)} finished, "
            f"{rec.num_free_blocks} free blocks<br><sub>forked (parent→child seq): {forks} · copy-on-write: {cows}"
            f"<br>pruned seqs: {pruned} · back to the free list: {_blocks(rec.freed_blocks)}</sub>")


def beam_stepper(rounds: list[BeamRound], decode=None) -> go.Figure:
    """`beam_round_figure` for every round in one figure, with a slider over the rounds."""
    width = max(len(r.beams) for r in rounds)
    num_columns = max(len(b.block_table) for r in rounds for b in r.beams)
    zmax = max(max(r.ref_counts) for r in rounds)
    return stepper(lambda i: beam_round_figure(rounds, i, decode, width, num_columns, zmax), len(rounds),
                   "round", 700, labels=[f"{r.round} (done)" if r.done else str(r.round) for r in rounds])
