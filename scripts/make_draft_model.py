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
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
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
              "history": stats["history"]}
    (args.out / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"saved to {args.out}", flush=True)


if __name__ == "__main__":
    main()
