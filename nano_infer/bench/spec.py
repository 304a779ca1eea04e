"""Speculative decoding: acceptance rate and speed-up against the same engine without it.

    python -m nano_infer.bench.spec               # shipped model + its draft, batch 1 and 32, 3 rounds
    python -m nano_infer.bench.spec --quick       # a smoke run
    python -m nano_infer.bench.spec --quote       # SmolLM2 repeating passages: chapter 09's committed result

The quote run takes minutes on a CPU (a real 135M model, float32, five rounds), too long for a chapter
that should run in a few: chapter 09 prints the result committed in `results/spec_quote.json`,
with the machine and its load at the time, and this command to measure it again.

Three workloads, each at batch 1 (requests one after another, like a single user) and at
batch 32 (all submitted at once):
- `edit` + n-gram prompt lookup: each request hands the model a passage and asks for it back
  with a change; an answer that quotes its prompt is where lookup finds its proposals;
- `quote` + n-gram prompt lookup: a passage to repeat word for word, for a real instruct model
  (`make models` puts SmolLM2-135M-Instruct on disk), which does quote it;
- `chat` + the draft model: free chat turns (held-out conversations shipped with the tiny model).
Greedy decoding, so both engines produce the same tokens (checked) and do the same work.
The engines take turns within each round, the order rotating; the speed-up is the ratio of the
two wall times in the same round, and the report gives medians over rounds.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from ..models.loader import TINY_MODEL_DIR
from ..sampling_params import SamplingParams
from ..spec import SpeculativeDecoder
from .timing import Comparison, verdict

DRAFT_DIR = TINY_MODEL_DIR.parent / "tiny_draft"
QUOTE_MODEL = Path(__file__).resolve().parents[2] / ".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"  # make models
QUOTE_RESULT = Path(__file__).resolve().parent / "results" / "spec_quote.json"
QUOTE_RUN = dict(workloads=("quote",), batches=(1,), batch1_requests=4, max_tokens=96, rounds=5, dtype="float32")
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1}
# an answer that repeats its prompt accepts long runs: propose more at once, from 2-token matches
# (SmolLM2-135M on a 2-core CPU, batch 1: k=4 1.60x, k=6 1.68x, k=8 1.77x in one run)
QUOTE_NGRAM = {"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
EDIT_TASK = "Say this again, word for word, but in plain modern English:\n"
QUOTE_TASK = "Repeat the following text exactly, word for word, and nothing else:\n\n"
PASSAGES = [
    "The lighthouse stands at the end of a long stone pier. Every evening the keeper climbs the ninety steps, "
    "cleans the great lens with a soft cloth and lights the lamp. Ships far out at sea see its beam sweep across "
    "the water once every ten seconds, and they know where the rocks are.",
    "To bake a simple loaf, mix flour, water, salt and a little yeast, then knead the dough for ten minutes until "
    "it is smooth. Leave it covered in a warm place for an hour, shape it, let it rise again and bake it in a hot "
    "oven until the crust is brown and the loaf sounds hollow when you tap it.",
    "The river begins as a small spring high in the hills. It runs through fields and forests, collects the water "
    "of many streams, and grows wide and slow before it reaches the town. There it passes under seven bridges and "
    "flows on to the sea, carrying boats, leaves and the light of the evening sun.",
    "The night train leaves the city at ten o'clock. Passengers find their seats, the doors close, and the "
    "carriages roll out past the last houses into the dark countryside. By morning the train has crossed two "
    "rivers and a range of mountains, and the travellers wake to see the sea.",
]


def heldout_conversations(model_dir: Path = TINY_MODEL_DIR) -> list[dict]:
    lines = (model_dir / "heldout_sample.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def chat_prompts(n: int) -> list[list[dict]]:
    """The opening turn (system + first user turn) of held-out conversations."""
    convs = heldout_conversations()
    return [convs[i % len(convs)]["messages"][:2] for i in range(n)]


def edit_prompts(n: int) -> list[list[dict]]:
    """A passage to give back changed: the first assistant speech of a held-out conversation."""
    convs = heldout_conversations()
    out = []
    for i in range(n):
        messages = convs[i % len(convs)]["messages"]
        passage = next(m["content"] for m in messages if m["role"] == "assistant")[:400]
        out.append([messages[0], {"role": "user", "content": EDIT_TASK + passage}])
    return out


def quote_prompts(n: int) -> list[list[dict]]:
    """A passage to repeat word for word: most of the answer can be looked up in the prompt."""
    return [[{"role": "user", "content": QUOTE_TASK + PASSAGES[i % len(PASSAGES)]}] for i in range(n)]


def run_once(llm, prompt_ids: list[list[int]], params: SamplingParams, batch: int):
    """Generate for every prompt, `batch` requests at a time. Returns (seconds, outputs, spec stats)."""
    engine = llm.engine
    before, decoder = None, engine.plugin(SpeculativeDecoder)
    if decoder is not None:
        s = decoder.stats
        before = (s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens, s.num_emitted_tokens)
    t0 = time.perf_counter()
    outs = []
    for i in range(0, len(prompt_ids), batch):
        outs += llm.generate(prompt_token_ids=prompt_ids[i : i + batch], sampling_params=params, use_tqdm=False)
    seconds = time.perf_counter() - t0
    if engine.prefix_cache is not None:  # every round starts cold: no engine gets the other's cache hits
        engine.kv.clear()
    stats = None
    if before is not None:
        s = decoder.stats
        drafts, proposed, accepted, emitted = (a - b for a, b in zip(
            (s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens, s.num_emitted_tokens), before))
        stats = {"verifies": drafts, "proposed": proposed, "accepted": accepted, "emitted": emitted,
                 "acceptance_rate": accepted / proposed if proposed else 0.0,
                 "tokens_per_verify": emitted / drafts if drafts else 0.0}
    return seconds, [o.outputs[0].token_ids for o in outs], stats


def measure(base, spec, prompt_ids, params, batch: int, rounds: int) -> dict:
    """Interleaved A/B rounds on the same prompts; per-round speed-up, medians."""
    rows = []
    for r in range(rounds):
        order = [("base", base), ("spec", spec)] if r % 2 == 0 else [("spec", spec), ("base", base)]
        got = {}
        for name, llm in order:
            got[name] = run_once(llm, prompt_ids, params, batch)
        (t_base, out_base, _), (t_spec, out_spec, stats) = got["base"], got["spec"]
        if out_base != out_spec:
            raise AssertionError("speculative greedy output differs from plain decoding")
        tokens = sum(len(o) for o in out_base)
        rows.append({"tokens": tokens, "base_s": t_base, "spec_s": t_spec, "speedup": t_base / t_spec,
                     "base_tok_s": tokens / t_base, "spec_tok_s": tokens / t_spec, **stats})
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    med["speedup"] = med["spec_tok_s"] / med["base_tok_s"]  # the ratio of the throughputs printed beside it
    return {"batch": batch, "rounds": rows, "median": med}


def run(workloads=("edit", "chat"), batches=(1, 32), requests: int = 32, batch1_requests: int = 4,
        max_tokens: int = 64, rounds: int = 3, draft: str | Path = DRAFT_DIR, draft_k: int = 3,
        ngram: dict | None = None, **engine_options) -> list[dict]:
    """Every (workload, batch) pair: base vs speculative engine. Returns one dict per pair."""
    from ..llm import LLM

    base = LLM(**engine_options)
    methods = {"edit": ("ngram", ngram or NGRAM), "quote": ("ngram", ngram or QUOTE_NGRAM),
               "chat": ("draft_model", {"method": "draft_model", "model": str(draft), "num_speculative_tokens": draft_k})}
    prompts_for = {"edit": edit_prompts, "quote": quote_prompts, "chat": chat_prompts}
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    results = []
    for workload in workloads:
        method, config = methods[workload]
        spec = LLM(speculative_config=config, **engine_options)
        prompts = prompts_for[workload](requests)
        ids = [base.apply_chat_template(m) for m in prompts]
        for batch in batches:
            sub = ids if batch > 1 else ids[:batch1_requests]
            r = measure(base, spec, sub, params, batch, rounds)
            results.append({"workload": workload, "method": method, "config": config, "requests": len(sub), **r})
            print(format_row(results[-1]), flush=True)
    return results


def speculation_verdict(r: dict) -> str:
    """From the rounds, not the median alone: "pays", "does not pay" or "inconclusive" (rounds on both sides of 1x)."""
    return verdict([x["speedup"] for x in r["rounds"]], 1.0, "pays", "does not pay")


def format_row(r: dict) -> str:
    m = r["median"]
    return (f"{r['workload']:>5} {r['method']:>11} batch {r['batch']:>3}: acceptance {m['acceptance_rate']:.2f}, "
            f"{m['tokens_per_verify']:.2f} tokens/verify; speed-up: {speedup_text(r)}")


def speedup_text(r: dict) -> str:
    """The speculative throughput over the plain one, as `timing.Comparison` says a ratio (the medians, their
    ratio, the rounds' range, the verdict); each round produced the same tokens, so throughput is 1 / time."""
    tokens = r["rounds"][0]["tokens"]
    per_s = Comparison("speculative", "plain", [tokens / x["spec_s"] for x in r["rounds"]],
                       [tokens / x["base_s"] for x in r["rounds"]], 1.0, "speculation pays", "speculation does not pay")
    return per_s.text(unit="tok/s", scale=1, digits=1)


def machine() -> dict:
    """Where and when a result was measured: CPU, cores, torch threads and the load average around it."""
    import os
    import platform

    import torch

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else platform.processor()
    return {"cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "load_average": [round(x, 2) for x in os.getloadavg()], "date": time.strftime("%Y-%m-%d %H:%M")}


def measure_quote(path: Path = QUOTE_RESULT, model: Path = QUOTE_MODEL) -> dict:
    """Chapter 09's quote run (QUOTE_RUN on SmolLM2), written to `path` with the machine it ran on."""
    if not model.exists():
        raise FileNotFoundError(f"{model} is missing: `make models` fetches it")
    before = machine()
    result = run(model=str(model), **QUOTE_RUN)[0]
    record = {"command": "python -m nano_infer.bench.spec --quote", "run": {**QUOTE_RUN, "model": model.name},
              "machine": before, "load_average_after": machine()["load_average"], "result": result}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    return record


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m nano_infer.bench.spec", description=__doc__.split("\n")[0])
    p.add_argument("--model", help="target checkpoint (default: the shipped model)")
    p.add_argument("--draft", default=str(DRAFT_DIR), help="draft checkpoint (default: the shipped draft)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--quick", action="store_true", help="4 requests, 16 tokens, 1 round")
    p.add_argument("--quote", action="store_true", help=f"chapter 09's quote run, written to {QUOTE_RESULT.name}")
    p.add_argument("--out", default="bench_results")
    a = p.parse_args(argv)
    if a.quote:
        print(f"wrote {QUOTE_RESULT} (load average {measure_quote()['machine']['load_average']} before)")
        return
    if a.quick:
        a.rounds, a.requests, a.max_tokens = 1, 4, 16
    results = run(requests=a.requests, batches=(1, a.requests), batch1_requests=min(4, a.requests),
                  max_tokens=a.max_tokens, rounds=a.rounds, draft=a.draft, model=a.model)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"spec-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(results, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
