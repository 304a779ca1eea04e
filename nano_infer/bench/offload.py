"""The second KV tier measured (notebook 12): what it saves on a multi-turn chat, what a load costs.

Three measurements, each reading only what the engine counts itself (the host tier's stats,
`RequestOutput.num_cached_tokens` and its metrics, the runner's forward tokens):

- multi-turn chat on a small device pool: several conversations take turns, one request at a
  time, so each chat's history has been evicted from the device by the time its next turn comes.
  Without a host tier the history is gone and is prefilled again; with one it is copied back.
  The engines compared run the same prompts, alternating request by request (`run_chats`).
- copy back vs recompute by prefix length: the time to first token of a request whose prefix is
  held only by the host tier (loaded back), only by the device cache, or by nothing (prefilled),
  interleaved in rounds with `nano_infer.bench.timing` (`load_vs_recompute`).
- preemption by swapping vs by recomputing: a batch that does not fit the device pool, run with
  each `preemption_mode` (`run_preempting`).

Timings are printed and compared, never asserted.
"""
from __future__ import annotations

import random
import statistics
from dataclasses import dataclass, field

from ..kv.host_tier import HostTierStats
from ..sampling_params import SamplingParams
from ..core.utils import cdiv
from .prefix import chat_prompt, questions, run_one, system_prompt
from .timing import Timings, interleaved, one_thread, verdict
from .workload import ordinary_token_ids


# -- the multi-turn chat workload --------------------------------------------------------------------
@dataclass
class Chats:
    """Conversations that share one system prompt; chat i's user turns are `turns[i]`."""

    system: str
    turns: list[list[str]]

    @property
    def num_requests(self) -> int:
        return sum(len(t) for t in self.turns)


def multi_turn_chats(tokenizer, num_chats: int = 8, num_turns: int = 4, system_tokens: int = 48) -> Chats:
    """`num_chats` conversations of `num_turns` user turns each, all different, after one system prompt
    of at least `system_tokens` tokens (the part every chat shares)."""
    lines = questions(num_chats * num_turns)
    return Chats(system_prompt(tokenizer, system_tokens),
                 [lines[c * num_turns:(c + 1) * num_turns] for c in range(num_chats)])


def turn_order(chats: Chats) -> list[tuple[int, int]]:
    """(chat, turn) in the order they are sent: every chat's turn t before any chat's turn t + 1, so
    the other chats' requests run between two turns of one chat (as users of one server do)."""
    num_turns = max(len(t) for t in chats.turns)
    return [(c, t) for t in range(num_turns) for c in range(len(chats.turns)) if t < len(chats.turns[c])]


def longest_request_blocks(tokenizer, chats: Chats, max_tokens: int, block_size: int) -> int:
    """KV blocks the workload's longest request can need: its last turn's prompt with every reply
    `max_tokens` tokens long (a filler word), plus its own reply. A device pool this size (plus a block
    or two) holds one request and little else: each chat's history is evicted before its next turn."""
    filler = " ".join(["lord"] * max_tokens)
    longest = 0
    for turns in chats.turns:
        messages = [{"role": "system", "content": chats.system}]
        for line in turns[:-1]:
            messages += [{"role": "user", "content": line}, {"role": "assistant", "content": filler}]
        messages.append({"role": "user", "content": turns[-1]})
        longest = max(longest, len(chat_prompt(tokenizer, messages)) + max_tokens)
    return cdiv(longest, block_size)


@dataclass
class TurnRecord:
    """One request of one engine: its size, what the caches served, what the model computed."""

    chat: int
    turn: int
    prompt_tokens: int
    cached_tokens: int  # served by a cache: device and host tier together (RequestOutput.num_cached_tokens)
    host_cached_tokens: int  # of those, loaded back from the host tier
    prefill_tokens: int  # prompt tokens the model computed
    ttft: float  # seconds (RequestOutput.metrics.ttft, wall clock)
    output_token_ids: list[int]
    blocks_in: int  # blocks copied host -> device for this request
    blocks_out: int  # blocks copied device -> host during this request (offloads of evicted blocks)


@dataclass
class ChatRun:
    """One engine's run of the workload, per request, and its host tier's counts over the run."""

    label: str
    records: list[TurnRecord] = field(default_factory=list)
    tier: HostTierStats | None = None  # what the tier counted during the run (None: no tier)

    @property
    def prompt_tokens(self) -> int:
        return sum(r.prompt_tokens for r in self.records)

    @property
    def cached_tokens(self) -> int:
        return sum(r.cached_tokens for r in self.records)

    @property
    def host_cached_tokens(self) -> int:
        return sum(r.host_cached_tokens for r in self.records)

    @property
    def device_cached_tokens(self) -> int:
        return self.cached_tokens - self.host_cached_tokens

    @property
    def prefill_tokens(self) -> int:
        return sum(r.prefill_tokens for r in self.records)

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def ttfts(self, first_turn: int = 0) -> list[float]:
        """TTFT of every request from turn `first_turn` on (turn 0 has no history to find)."""
        return [r.ttft for r in self.records if r.turn >= first_turn]

    def summary(self, first_turn: int = 1) -> dict:
        """The run's figures in one row; TTFTs over the turns from `first_turn` on."""
        ttfts = self.ttfts(first_turn)
        return {"engine": self.label, "requests": len(self.records), "prompt tokens": self.prompt_tokens,
                "cached (device)": self.device_cached_tokens, "cached (host tier)": self.host_cached_tokens,
                "cached": self.cached_tokens, "hit rate": round(self.hit_rate, 3),
                "prefilled": self.prefill_tokens,
                "median TTFT ms": 1000 * statistics.median(ttfts), "mean TTFT ms": 1000 * statistics.mean(ttfts),
                "blocks out": self.tier.offloaded_blocks if self.tier else 0,
                "blocks in": self.tier.loaded_blocks if self.tier else 0,
                "blocks dropped": self.tier.dropped_blocks if self.tier else 0}


def tier_stats(llm) -> HostTierStats:
    """A copy of the engine's host tier counters (all zero without a tier)."""
    tier = llm.engine.offloader.tier if llm.engine.offloader is not None else None
    return HostTierStats(**vars(tier.stats)) if tier is not None else HostTierStats()


def stats_delta(after: HostTierStats, before: HostTierStats) -> HostTierStats:
    """What the tier counted between two copies of its stats."""
    return HostTierStats(**{k: v - getattr(before, k) for k, v in vars(after).items()})


def run_turn(llm, prompt_ids: list[int], max_tokens: int, chat: int = 0, turn: int = 0) -> tuple[TurnRecord, object]:
    """One request alone on the engine (chapter 03's `run_one`), with what the tier did for it."""
    before = tier_stats(llm)
    one, out = run_one(llm, prompt_ids, max_tokens)
    moved = stats_delta(tier_stats(llm), before)
    record = TurnRecord(chat, turn, one.prompt_tokens, one.cached_tokens, out.metrics.num_host_cached_tokens,
                        one.prefill_tokens, one.ttft, one.output_token_ids, moved.blocks_in, moved.blocks_out)
    return record, out


def run_chats(llms: dict, chats: Chats, max_tokens: int = 16) -> dict[str, ChatRun]:
    """Send every turn of every chat (in `turn_order`) to every engine, the engines taking turns request by
    request (order rotated), so a burst of load on the machine hits them alike.

    All engines get the same prompts: each chat's history holds the first engine's replies (the
    notebook checks the others replied the same tokens). Returns one ChatRun per engine.
    """
    labels = list(llms)
    before = {label: tier_stats(llm) for label, llm in llms.items()}
    runs = {label: ChatRun(label) for label in labels}
    history = [[{"role": "system", "content": chats.system}] for _ in chats.turns]
    tokenizer = llms[labels[0]].tokenizer
    for i, (c, t) in enumerate(turn_order(chats)):
        messages = history[c] + [{"role": "user", "content": chats.turns[c][t]}]
        prompt = chat_prompt(tokenizer, messages)
        replies = {}
        for label in labels[i % len(labels):] + labels[:i % len(labels)]:
            record, out = run_turn(llms[label], prompt, max_tokens, c, t)
            runs[label].records.append(record)
            replies[label] = out.outputs[0].text
        history[c] = messages + [{"role": "assistant", "content": replies[labels[0]]}]
    for label, llm in llms.items():
        if llm.engine.offloader is not None:
            runs[label].tier = stats_delta(tier_stats(llm), before[label])
    return runs


def warm_up(llm, num_tokens: int = 64) -> None:
    """One untimed request of throwaway tokens (allocator, lazy pool pages), then both tiers emptied."""
    ids = ordinary_token_ids(llm.tokenizer)
    rng = random.Random(-1)
    run_turn(llm, [rng.choice(ids) for _ in range(num_tokens)], 2)
    llm.engine.kv.clear()


# -- copy back vs recompute, by prefix length ----------------------------------------------------------------
def offload_cached(llm) -> int:
    """Untimed set-up: push every idle cached device block to the host tier now. Evict them all (each is
    offloaded), then run a throwaway one-token request: its step runs the queued device -> host copies,
    and a prompt of one token fills no block, so it caches nothing. Returns how many blocks went."""
    kv = llm.engine.kv
    num = kv.evict(kv.prefix_cache.num_evictable_blocks())
    run_turn(llm, llm.tokenizer.encode("a", add_special_tokens=False)[:1], 1)
    return num


def prefixed_prompt(tokenizer, prefix_tokens: int, suffix_tokens: int = 8, seed: int = 0) -> list[int]:
    """`prefix_tokens` then `suffix_tokens` ordinary token ids drawn with `seed` (what they say does not
    matter to a timing); the prefix should be whole blocks."""
    ids = ordinary_token_ids(tokenizer)
    rng = random.Random(seed)
    return [rng.choice(ids) for _ in range(prefix_tokens + suffix_tokens)]


VARIANTS = ("host tier", "device cache", "no cache")


@dataclass
class PrefixCost:
    """Time to first token of one prompt per variant, one sample per round; and what each request was served."""

    prefix_tokens: int
    prompt_tokens: int
    timings: Timings
    cached: dict[str, int]  # tokens served from a cache, per variant (the last round's)
    host_cached: dict[str, int]  # of those, from the host tier
    blocks_loaded: int  # blocks the host-tier variant copied back

    def row(self) -> dict:
        """Medians; recompute / load and load / device hit, each the ratio of the medians beside it, with the
        range of the per-round ratios and a verdict on recompute / load from them."""
        ratios = self.timings.ratios("no cache", "host tier")
        extra = self.timings.ratios("host tier", "device cache")
        return {"prefix tokens": self.prefix_tokens, "blocks loaded": self.blocks_loaded,
                **{f"{v} ms": 1000 * self.timings.median(v) for v in VARIANTS},
                "recompute / load": self.timings.ratio("no cache", "host tier"),
                "rounds": f"{min(ratios):.2f}-{max(ratios):.2f}",
                "load / device hit": self.timings.ratio("host tier", "device cache"),
                "rounds ": f"{min(extra):.2f}-{max(extra):.2f}",
                "verdict": verdict(ratios, 1.0, "copy wins", "recompute wins")}


def prefix_cost(llm, prefix_tokens: int, rounds: int = 5, warmup: int = 1, suffix_tokens: int = 8) -> PrefixCost:
    """TTFT of a prompt whose first `prefix_tokens` are held by the host tier only (copied back), by the
    device cache (shared), or by neither (prefilled), interleaved in rounds.

    Each variant's set-up, untimed, empties both tiers and puts the prefix where the variant wants it;
    the timed part is the whole request with `max_tokens=1`, i.e. its time to first token, on the
    CPU-time clock of `nano_infer.bench.timing`.
    """
    prompt = prefixed_prompt(llm.tokenizer, prefix_tokens, suffix_tokens, seed=prefix_tokens)
    kv, served = llm.engine.kv, {}

    def setup(name):
        kv.clear()
        if name != "no cache":
            run_turn(llm, prompt, 1)
        if name == "host tier":
            offload_cached(llm)

    def variant(name):
        def run():
            record, _ = run_turn(llm, prompt, 1)
            served[name] = record
        return run

    timings = interleaved({name: variant(name) for name in VARIANTS}, rounds=rounds, warmup=warmup, setup=setup)
    kv.clear()
    return PrefixCost(prefix_tokens, len(prompt), timings, {v: r.cached_tokens for v, r in served.items()},
                      {v: r.host_cached_tokens for v, r in served.items()}, served["host tier"].blocks_in)


def load_vs_recompute(llm, lengths: list[int], rounds: int = 5, warmup: int = 1) -> list[PrefixCost]:
    """`prefix_cost` for every prefix length, torch on one thread (see `nano_infer.bench.timing`)."""
    with one_thread():
        return [prefix_cost(llm, n, rounds, warmup) for n in lengths]


def cost_model_estimate(llm, prefix_tokens: int) -> dict:
    """What the engine's own cost model (the rates it measured so far) predicts for one prefix: seconds to
    copy its blocks back, seconds to prefill it again."""
    cost, block_size = llm.engine.kv.cost, llm.engine.kv.block_size
    num_blocks = prefix_tokens // block_size
    load = num_blocks * cost.bytes_per_block / cost.copy_bytes_per_s
    recompute = prefix_tokens / cost.prefill_tokens_per_s
    return {"prefix tokens": prefix_tokens, "model: load ms": 1000 * load, "model: recompute ms": 1000 * recompute,
            "model: recompute / load": recompute / load}


# -- preemption: swap or recompute ------------------------------------------------------------------------------
@dataclass
class PreemptionRun:
    """One batch run to the end under one preemption mode."""

    label: str
    outputs: list[list[int]]  # output token ids per request
    forward_tokens: int  # tokens through the model, prompt and decode
    preemptions: int  # of the requests' sequences, however they were preempted (RequestMetrics)
    tier: HostTierStats  # what the tier counted: preemptions of each kind, blocks swapped each way

    def row(self) -> dict:
        t = self.tier
        return {"mode": self.label, "forward tokens": self.forward_tokens, "preemptions": self.preemptions,
                "swap preemptions": t.swap_preemptions, "recompute preemptions": t.recompute_preemptions,
                "blocks swapped out": t.swapped_out_blocks, "blocks swapped in": t.swapped_in_blocks}


def run_preempting(llm, prompts: list[list[int]], max_tokens: int, label: str | None = None) -> PreemptionRun:
    """Every prompt queued at once (greedy, `ignore_eos`, so every mode runs the same tokens); with a device
    pool too small for all of them to decode to the end, the scheduler preempts."""
    engine, before = llm.engine, tier_stats(llm)
    tokens = engine.runner.num_forward_tokens
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    outs = llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
    return PreemptionRun(label or engine.config.preemption_mode, [list(o.outputs[0].token_ids) for o in outs],
                         engine.runner.num_forward_tokens - tokens, sum(o.metrics.num_preemptions for o in outs),
                         stats_delta(tier_stats(llm), before))
