#!/usr/bin/env python
"""Build the draft model for speculative decoding that ships in nano_infer/models/tiny_draft/.

    .venv/bin/python scripts/make_draft_model.py                 # the shipped draft (defaults)
    .venv/bin/python scripts/make_draft_model.py --steps 5 --out /tmp/draft   # a smoke run

The draft is the shipped tiny model cut to its first layer(s) (same tokenizer, embeddings, final
norm and tied head), then distilled: trained to match the full model's next-token distribution
on the same Shakespeare conversations (KL divergence on assistant tokens). It needs the target
(nano_infer/models/tiny) built first.
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

HELDOUT_PLAYS = ("julius_caesar_gut", "tempest_gut", "twelfth_night_gut")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--target", type=Path, default=ROOT / "nano_infer" / "models" / "tiny")
    p.add_argument("--out", type=Path, default=ROOT / "nano_infer" / "models" / "tiny_draft")
    p.add_argument("--data", type=Path, default=ROOT / "data")
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--card-only", action="store_true", help="rewrite README.md from the eval.json in --out")
    return p.parse_args(argv)


def command_line(args) -> str:
    defaults = vars(parse_args([]))
    extra = [f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
             if k not in ("out", "data", "target", "card_only") and v != defaults[k]]
    return " ".join([".venv/bin/python scripts/make_draft_model.py"] + extra)


def model_card(r: dict) -> str:
    b, a = r["heldout_before"], r["heldout_after"]
    return f"""# nano_infer tiny draft: a one-layer sibling of the shipped model, for speculative decoding

The draft model that `LLM(speculative_config={{"method": "draft_model", "model": <this folder>,
"num_speculative_tokens": 3}})` uses with the shipped tiny model (`nano_infer/models/tiny`),
in notebook 09. It has the target's tokenizer (the files are copies), its embeddings, final
norm and tied output head, and {r["layers"]} decoder layer(s) instead of 5: {r["params"]:,} parameters.

## How it was made

1. Cut the target down to its first {r["layers"]} layer(s) (everything else kept as is).
2. Distil: train the layer(s) and the final norm (the tied embedding/head stays frozen) to
   match the target's next-token distribution, KL(p_target || q_draft), on the assistant
   tokens of the target's training conversations (the same Shakespeare plays; the held-out
   plays are never seen). A draft proposal is accepted with probability min(1, p/q), so the
   expected acceptance per token is 1 - TV(p, q): the draft should imitate the target, not the text.
3. AdamW, lr {r["lr"]} (cosine), {r["steps"]} steps of {r["batch_size"]} rows x {r["seq_len"]} tokens
   ({r["tokens_seen"]:,} tokens), seed {r["seed"]}, {r["threads"]} CPU thread(s):
   {r["train_seconds"]:.0f} s on a 2-core CPU shared with other jobs.

Reproduce (needs the target built first; `make tiny-draft`):

```
{r["command"]}
```

## Acceptance (held-out plays, assistant tokens, {a["tokens"]:,} tokens of {a["conversations"]} conversations)

| | greedy acceptance (draft argmax = target argmax) | sampled acceptance at temperature 1 (mean of 1 - TV(p, q)) | KL(p, q) in nats |
|---|---|---|---|
| first layer(s) of the target, before distillation | {b["greedy_agreement"]:.3f} | {b["sampled_acceptance"]:.3f} | {b["kl"]:.3f} |
| this draft | {a["greedy_agreement"]:.3f} | {a["sampled_acceptance"]:.3f} | {a["kl"]:.3f} |

These are per-token rates on teacher-forced text; the rate the engine reports on its own
outputs (`engine.plugin(SpeculativeDecoder).stats.acceptance_rate`), and the speed-up it buys, are measured in
notebook 09 and by `python -m nano_infer.bench.spec`. `eval.json` has the numbers above.
"""


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.card_only:
        result = json.loads((args.out / "eval.json").read_text())
        (args.out / "README.md").write_text(model_card(result), encoding="utf-8")
        return
    import functools

    import torch
    from tokenizers import Tokenizer
    from transformers import Qwen2ForCausalLM

    from tiny_model import conversations as conv, corpus, distill, train as tr

    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)

    tok = Tokenizer.from_file(str(args.target / "tokenizer.json"))
    pad_id = tok.token_to_id("<|endoftext|>")
    plays = corpus.load_plays(corpus.fetch(args.data))
    n_tok = functools.lru_cache(maxsize=None)(lambda s: len(tok.encode(s, add_special_tokens=False).ids))
    train_ex = [conv.encode(tok, c) for c in conv.build_conversations(
        [p for p in plays if p.key not in HELDOUT_PLAYS], n_tok, args.seq_len)]
    held_ex = [conv.encode(tok, c) for c in conv.build_conversations(
        [p for p in plays if p.key in HELDOUT_PLAYS], n_tok, args.seq_len)]
    random.Random(args.seed).shuffle(held_ex)

    target = Qwen2ForCausalLM.from_pretrained(args.target, dtype=torch.float32)
    draft = distill.truncated_copy(target, args.layers)
    before = distill.agreement(draft, target, held_ex)
    print(f"  {sum(p.numel() for p in draft.parameters()):,} parameters; before: {before}", flush=True)

    stream = tr.batches(train_ex, lambda ex, s: conv.pack(ex, args.seq_len, pad_id, s), args.batch_size, args.seed)
    stats = distill.distill(draft, target, stream, args.steps, args.lr, args.warmup)
    after = distill.agreement(draft, target, held_ex)
    print(f"  after: {after}", flush=True)

    draft.generation_config = target.generation_config
    draft.save_pretrained(args.out, safe_serialization=True)
    cfg = json.loads((args.out / "config.json").read_text())
    cfg["torch_dtype"] = cfg["dtype"] = "float32"
    (args.out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    for name in TOKENIZER_FILES:
        shutil.copy(args.target / name, args.out / name)
    result = {"params": sum(p.numel() for p in draft.parameters()), "layers": args.layers,
              "steps": args.steps, "batch_size": args.batch_size, "seq_len": args.seq_len,
              "lr": args.lr, "seed": args.seed, "threads": args.threads,
              "heldout_before": before, "heldout_after": after,
              "train_seconds": round(stats["train_seconds"], 1), "tokens_seen": stats["tokens_seen"],
              "command": command_line(args), "history": stats["history"]}
    (args.out / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "README.md").write_text(model_card(result), encoding="utf-8")
    print(f"saved to {args.out}", flush=True)


if __name__ == "__main__":
    main()
