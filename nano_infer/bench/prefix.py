"""Prefix-cache workloads and measurements (notebooks 03 and 04).

Three request patterns a prefix cache exists for, all built as chat conversations so the
chat template (system message, turn markers) is part of what gets shared:

- shared system prompt: N requests, one long system message, a different question each;
- multi-turn chat: every request is the whole conversation so far;
- branching conversations: a trunk A continued several ways (A+B, A+C, ...), each
  branch then going on for a turn or two.

The measurements only read what the engine counts itself: `engine.runner.num_forward_tokens`
(tokens pushed through the model), `RequestOutput.num_cached_tokens`, `metrics.ttft` and
the prefix cache's stats. Requests run one at a time, like a user waiting for each reply,
so a request's forward tokens are its own. Timings are compared side by side in one run:
the engines take turns on every prompt and medians are reported, because another busy
process on the machine slows whichever engine happens to be running.
"""
from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass, field

from ..sampling_params import SamplingParams

ROLE_LINE = "You are {character} in {play}. Stay in character and answer in Shakespeare's words."
# Scene notes that pad the system message to the length a workload asks for.
SCENE_NOTES = [
    "The scene is the castle at Elsinore, a cold night upon the platform.",
    "The king your father is dead these two months, and his brother wears the crown.",
    "Your mother the queen has married the new king within a month of the funeral.",
    "Horatio and the watch have twice seen a ghost in the armour of the late king.",
    "Polonius, the lord chamberlain, is a tedious old man who loves to give advice.",
    "His son Laertes is bound for France, and his daughter Ophelia loves you.",
    "Rosencrantz and Guildenstern were your friends at school and are now the king's spies.",
    "A company of players has come to the court, and you mean to catch the king's conscience.",
    "Speak in verse when the matter is grave and in prose when you play the madman.",
    "Never break character, never speak of the modern world, and answer every question asked.",
    "When you are angry, be sharp and quick; when you grieve, be slow and full of doubt.",
    "The court is full of ears: what you say in the hall, the king will know by supper.",
]
SPEAKERS = ["HORATIO", "OPHELIA", "GERTRUDE", "POLONIUS", "LAERTES", "CLAUDIUS", "MARCELLUS", "OSRIC"]
LINES = [
    "My lord, the king your father's ghost walks upon the platform.",
    "How does your honour for this many a day?",
    "Good Hamlet, cast thy nighted colour off.",
    "What do you read, my lord?",
    "Will you walk out of the air, my lord?",
    "Where is your father?",
    "The queen desires to speak with you before you go to bed.",
    "Is it not strange that the dead should walk again?",
    "What shall we do with the players?",
    "Sweet lord, if your leisure served, I should impart a thing to you.",
    "Why do you look so sad upon this day of joy?",
    "Shall we go in to supper?",
]


def questions(n: int) -> list[str]:
    """n different user turns in the "SPEAKER: line" form the shipped model was trained on."""
    pairs = [(s, l) for i in range(len(LINES)) for s, l in zip(SPEAKERS, LINES[i:] + LINES[:i])]
    if n > len(pairs):
        raise ValueError(f"at most {len(pairs)} different questions, asked for {n}")
    return [f"{s}: {l}" for s, l in pairs[:n]]


def chat_prompt(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of a conversation in the model's chat template, ready for the assistant's turn."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return list(ids)


def system_prompt(tokenizer, num_tokens: int, character: str = "HAMLET", play: str = "Hamlet") -> str:
    """A system message of at least `num_tokens` tokens: the role line, then scene notes."""
    parts = [ROLE_LINE.format(character=character, play=play)]
    while len(tokenizer.encode(" ".join(parts), add_special_tokens=False)) < num_tokens:
        parts.append(SCENE_NOTES[(len(parts) - 1) % len(SCENE_NOTES)])
    return " ".join(parts)


@dataclass
class ChatWorkload:
    """Requests as paths of user turns; each request is the conversation along its path.

    The assistant turns in between are the model's own greedy replies, filled in while
    the workload runs, so a request sends exactly the history a chat client would.
    A path's parent (the path minus its last turn) always comes earlier in `paths`.
    """

    name: str
    system: str
    paths: list[tuple[str, ...]]


def shared_system_prompt(tokenizer, num_requests: int, system_tokens: int) -> ChatWorkload:
    return ChatWorkload("shared system prompt", system_prompt(tokenizer, system_tokens),
                        [(q,) for q in questions(num_requests)])


def multi_turn_chat(tokenizer, num_turns: int, system_tokens: int) -> ChatWorkload:
    turns = tuple(questions(num_turns))
    return ChatWorkload("multi-turn chat", system_prompt(tokenizer, system_tokens),
                        [turns[: i + 1] for i in range(num_turns)])


def branching_chat(tokenizer, num_branches: int, system_tokens: int, trunk_turns: int = 1,
                   branch_turns: int = 2, breadth_first: bool = False) -> ChatWorkload:
    """Trunk A (trunk_turns turns), then num_branches continuations, each branch_turns turns long.

    Depth first (the default), branches run one after another: A+B, A+B+B', then A+C, ...
    Breadth first, every branch takes its first turn before any takes its second (A+B,
    A+C, ..., then A+B+B', A+C+C', ...), so a branch comes back to the cache after the
    others have run: what a server sees from several users continuing one shared thread.
    """
    qs = questions(trunk_turns + num_branches * branch_turns)
    trunk = tuple(qs[:trunk_turns])
    paths = [trunk[: i + 1] for i in range(trunk_turns)]
    branches = [qs[trunk_turns + b * branch_turns : trunk_turns + (b + 1) * branch_turns] for b in range(num_branches)]
    if breadth_first:
        paths += [trunk + tuple(own[: i + 1]) for i in range(branch_turns) for own in branches]
    else:
        paths += [trunk + tuple(own[: i + 1]) for own in branches for i in range(branch_turns)]
    order = "breadth first" if breadth_first else "depth first"
    return ChatWorkload(f"branching ({num_branches} branches, {order})", system_prompt(tokenizer, system_tokens), paths)


# -- running and measuring ---------------------------------------------------------------------
@dataclass
class RequestRecord:
    prompt_token_ids: list[int]
    prompt_tokens: int
    cached_tokens: int  # served by the prefix cache (RequestOutput.num_cached_tokens)
    prefill_tokens: int  # prompt tokens the model computed: forward tokens minus decode tokens
    output_token_ids: list[int]
    ttft: float
    cached_blocks: int  # blocks the prefix cache holds once the request has finished


@dataclass
class RunResult:
    label: str
    records: list[RequestRecord] = field(default_factory=list)
    evicted_blocks: int = 0  # cached blocks given up to make room during the run

    @property
    def prompt_tokens(self) -> int:
        return sum(r.prompt_tokens for r in self.records)

    @property
    def prefill_tokens(self) -> int:
        return sum(r.prefill_tokens for r in self.records)

    @property
    def cached_tokens(self) -> int:
        return sum(r.cached_tokens for r in self.records)

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def peak_cached_blocks(self) -> int:
        return max((r.cached_blocks for r in self.records), default=0)

    def summary(self) -> dict:
        return {"engine": self.label, "requests": len(self.records), "prompt tokens": self.prompt_tokens,
                "prefill tokens": self.prefill_tokens, "hit rate": round(self.hit_rate, 3),
                "cached blocks (end)": self.records[-1].cached_blocks if self.records else 0,
                "cached blocks (peak)": self.peak_cached_blocks, "evicted blocks": self.evicted_blocks}


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens)


def run_one(llm, prompt_ids: list[int], max_tokens: int) -> tuple[RequestRecord, object]:
    """Run one request alone; its prefill work is the runner's token count minus its decode steps."""
    engine = llm.engine
    if engine.has_unfinished_requests():
        raise ValueError("run_one measures a request alone: the engine still has requests in flight")
    before = engine.runner.num_forward_tokens
    out = llm.generate(prompt_token_ids=[prompt_ids], sampling_params=greedy(max_tokens))[0]
    forward = engine.runner.num_forward_tokens - before
    decode = max(0, len(out.outputs[0].token_ids) - 1)  # the last sampled token is never fed back
    cache = engine.prefix_cache
    record = RequestRecord(
        prompt_token_ids=list(prompt_ids), prompt_tokens=len(prompt_ids), cached_tokens=out.num_cached_tokens,
        prefill_tokens=forward - decode, output_token_ids=list(out.outputs[0].token_ids), ttft=out.metrics.ttft,
        cached_blocks=cache.num_cached_blocks() if cache is not None else 0)
    return record, out


def _evictions(llm) -> int:
    """Blocks the engine's prefix cache has evicted so far (0 without a paged cache: nothing to evict)."""
    return getattr(llm.engine.kv, "num_evicted_blocks", 0)


def run_workload(llm, workload: ChatWorkload, max_tokens: int = 16, label: str | None = None) -> RunResult:
    """Send the workload's requests one after another, replies filled in from the model."""
    label = label or str(llm.engine.config.prefix_cache)
    evicted_before = _evictions(llm)
    history: dict[tuple[str, ...], list[dict]] = {(): [{"role": "system", "content": workload.system}]}
    result = RunResult(label)
    for path in workload.paths:
        messages = history[path[:-1]] + [{"role": "user", "content": path[-1]}]
        record, out = run_one(llm, chat_prompt(llm.tokenizer, messages), max_tokens)
        history[path] = messages + [{"role": "assistant", "content": out.outputs[0].text}]
        result.records.append(record)
    result.evicted_blocks = _evictions(llm) - evicted_before
    return result


_staggered_ids = itertools.count()


def run_staggered(llm, prompts: list[list[int]], max_tokens: int, steps_between: int = 2, on_step=None,
                  request_ids: list[str] | None = None) -> list:
    """Add a request every `steps_between` engine steps, so later ones arrive while earlier ones run.

    `on_step(engine, step_outputs)` is called after every step (e.g. to snapshot the radix
    tree). Returns the finished RequestOutputs in submission order.
    """
    engine, params, done = llm.engine, greedy(max_tokens), {}
    ids = request_ids or [f"staggered-{next(_staggered_ids)}" for _ in prompts]
    if len(ids) != len(prompts):
        raise ValueError(f"{len(ids)} request_ids for {len(prompts)} prompts")
    pending = list(zip(ids, prompts))
    while pending or engine.has_unfinished_requests():
        if pending:
            rid, prompt = pending.pop(0)
            engine.add_request(rid, params=params, prompt_token_ids=prompt)
        for _ in range(steps_between if pending else 1):
            outs = engine.step()
            done.update((o.request_id, o) for o in outs if o.finished)
            if on_step is not None:
                on_step(engine, outs)
    return [done[rid] for rid in ids]


# -- time to first token, with and without the cache --------------------------------------------
@dataclass
class TTFTComparison:
    """Per engine, the TTFT of every prompt (seconds) and the prompt tokens the cache served."""

    ttft: dict[str, list[float]]
    prompt_tokens: list[int]
    cached_tokens: dict[str, list[int]]

    def median(self, label: str) -> float:
        return statistics.median(self.ttft[label])

    def ideal_speedup(self, label: str) -> float:
        """prompt_len / uncached_len: the speedup if TTFT were proportional to prefill tokens."""
        return statistics.median(p / (p - c) for p, c in zip(self.prompt_tokens, self.cached_tokens[label]))

    def speedup(self, label: str, baseline: str) -> float:
        return self.median(baseline) / self.median(label)


def compare_ttft(llms: dict, prompts: list[list[int]], warmup: list[int] | None = None) -> TTFTComparison:
    """Time the first token of every prompt on every engine, engines taking turns.

    Every prefix cache is cleared first, so hits come only from `warmup` and the prompts
    themselves. `warmup` runs first on each engine, untimed: it fills the caches with what
    the prompts share (e.g. the system prompt) and warms up the model code. The order of
    the engines rotates from prompt to prompt, so none always runs first.
    """
    labels = list(llms)
    for llm in llms.values():
        if llm.engine.prefix_cache is not None:
            llm.engine.kv.clear()
    if warmup is not None:
        for label in labels:
            run_one(llms[label], warmup, 1)
    ttft = {label: [] for label in labels}
    cached = {label: [] for label in labels}
    for i, prompt in enumerate(prompts):
        for label in labels[i % len(labels):] + labels[: i % len(labels)]:
            record, _ = run_one(llms[label], prompt, 1)
            ttft[label].append(record.ttft)
            cached[label].append(record.cached_tokens)
    return TTFTComparison(ttft, [len(p) for p in prompts], cached)


def ttft_vs_prefix_length(llms: dict, tokenizer, lengths: list[int], num_questions: int = 5) -> list[dict]:
    """For each shared system-prompt length: median TTFT per engine, and the ideal speedup of each."""
    rows = []
    for n in lengths:
        workload = shared_system_prompt(tokenizer, num_questions + 1, n)
        prompts = [chat_prompt(tokenizer, [{"role": "system", "content": workload.system},
                                           {"role": "user", "content": q}]) for (q,) in workload.paths]
        comparison = compare_ttft(llms, prompts[1:], warmup=prompts[0])
        shared = len(common_prefix(prompts))
        for label in llms:
            rows.append({"shared prefix tokens": shared, "prompt tokens": statistics.median(comparison.prompt_tokens),
                         "engine": label, "median TTFT ms": 1000 * comparison.median(label),
                         "ideal speedup": comparison.ideal_speedup(label)})
    return rows


def common_prefix(prompts: list[list[int]]) -> list[int]:
    """The longest token prefix every prompt starts with."""
    first = prompts[0]
    n = len(first)
    for p in prompts[1:]:
        n = min(n, len(p))
        n = next((i for i in range(n) if p[i] != first[i]), n)
    return first[:n]
