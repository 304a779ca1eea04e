"""A Mixture-of-Experts model, nano_infer against transformers' continuous batching: `python -m nano_infer.bench.moe`.

On random weights of a real MoE model's shape, scaled down (random_model.py says how: the real number of
experts and top-k, half the widths, 4 layers), both engines loaded once on the same weights in the same dtype:
- one chat: a 128-token prompt, then decode; compared by the time per decoded token (its inverse is the decode
  tok/s printed beside it);
- 32 chats at once (prompts and outputs of mixed lengths, all arriving at t=0): compared by the time per output
  token of the whole batch, the inverse of the total tok/s;
- a decode step's split at 1 and at 32 chats: router, grouping (the sort by expert), the experts' matmuls, the
  gather, weighting and scatter-add around them, attention, the LM head and the rest. A step is timed piece by
  piece in place on one thread (its CPU time, which a neighbour on the machine distorts least), so it is a share
  of a step, not the engines' two-thread speed;
- parameters against active parameters per token (every weight but the experts a token skips).

Rounds alternate the engines (bench/compare.py); each ratio is transformers' median over nano_infer's, with the
range of the per-round ratios and a verdict from them (timing.Comparison).

    python -m nano_infer.bench.moe                                   # the OLMoE-1B-7B shape, a few minutes
    python -m nano_infer.bench.moe --model qwen3-30b-a3b-shape --rounds 3
    python -m nano_infer.bench.moe --model /path/to/checkpoint --dtype float32

`python -m nano_infer.bench` runs it too, after the dense models (`--no-moe` leaves it out).
"""
from __future__ import annotations

import argparse
import time
from collections import Counter
from statistics import median

import torch

from ..models import moe
from ..models.loader import default_model, resolve_model_dir
from .compare import Bench
from .profile import _hook, _timed, decoding
from .random_model import OLMOE_1B_7B, QWEN3_30B_A3B, random_model
from .timing import Comparison, one_thread

MOE_SHAPES = {"olmoe-1b-7b-shape": OLMOE_1B_7B, "qwen3-30b-a3b-shape": QWEN3_30B_A3B}
ENGINES = ("nano_infer", "hf_continuous")
PIECES = ["router (gate, softmax, top-k)", "grouping (sort by expert)", "expert matmuls (gate-up, SiLU, down)",
          "gather, weigh and scatter-add", "attention (projections, RoPE, KV, SDPA)", "LM head", "the rest"]


def moe_folder(name: str) -> str:
    """The checkpoint folder a --model value names: a shape of MOE_SHAPES (built once, offline, with the shipped
    model's tokenizer) or a folder."""
    if name in MOE_SHAPES:
        print(f"building (or reusing) a random-weight {name} model ...", flush=True)
        return str(random_model(resolve_model_dir(default_model()), MOE_SHAPES[name], name))
    return name


def parameter_counts(model, config) -> dict:
    """Parameters the model holds, those of its experts, and those one token multiplies by: all but the experts
    it skips (the embedding table counted whole, as model cards count it)."""
    total = sum(p.numel() for p in model.parameters())
    experts = skipped = 0
    for m in model.modules():
        if isinstance(m, moe.Experts):
            held = sum(p.numel() for p in m.parameters())
            experts += held
            skipped += held * (m.num_experts - config.num_experts_per_tok) // m.num_experts
    return {"total": total, "experts": experts, "active": total - skipped}


def compare(result: dict, per_token) -> Comparison:
    """transformers' continuous batching over nano_infer, one `per_token(round)` seconds each per round."""
    rows = result["per_round"]
    return Comparison("transformers CB", "nano_infer", [per_token(r) for r in rows["hf_continuous"]],
                      [per_token(r) for r in rows["nano_infer"]], 1.0, above="nano_infer faster",
                      below="transformers faster")


def decode_seconds(row: dict) -> float:
    return row["itl_mean_ms"] / 1e3


def batch_seconds(row: dict) -> float:
    return row["wall_s"] / row["output_tokens"]


def one_chat(bench: Bench, rounds: int, prompt_len: int = 128, output_len: int = 64, seed: int = 0) -> dict:
    """One request alone: seconds per decoded token (after the first) of each engine, each round."""
    result = bench.run(1, rounds, seed, (prompt_len, prompt_len), (output_len, output_len), log=lambda *_: None)
    c = compare(result, decode_seconds)
    print(f"-- one chat, {prompt_len}-token prompt, {output_len} tokens: decode {1 / median(c.fast):.1f} tok/s "
          f"nano_infer, {1 / median(c.slow):.1f} transformers CB\n   per decoded token: {c.text()}", flush=True)
    return {"per_round": result["per_round"], "ratio": c.ratio, "ratios": c.ratios, "verdict": c.verdict,
            "decode_tokens_per_s": {"nano_infer": 1 / median(c.fast), "hf_continuous": 1 / median(c.slow)}}


def chats(bench: Bench, n: int, rounds: int, prompt_len=(32, 160), output_len=(32, 64), seed: int = 0) -> dict:
    """`n` requests at t=0: seconds per output token of the whole batch, each engine, each round."""
    result = bench.run(n, rounds, seed, prompt_len, output_len, log=lambda *_: None)
    c = compare(result, batch_seconds)
    print(f"-- {n} chats, prompts {prompt_len[0]}-{prompt_len[1]}, outputs {output_len[0]}-{output_len[1]} tokens: "
          f"{1 / median(c.fast):.1f} tok/s nano_infer, {1 / median(c.slow):.1f} transformers CB\n"
          f"   per output token: {c.text()}", flush=True)
    return {"per_round": result["per_round"], "ratio": c.ratio, "ratios": c.ratios, "verdict": c.verdict,
            "tokens_per_s": {"nano_infer": 1 / median(c.fast), "hf_continuous": 1 / median(c.slow)}}


def step_split(engine, num_seqs: int, context: int = 128, steps: int = 8) -> dict:
    """CPU seconds per decode step of `num_seqs` sequences at about `context` tokens, and per piece (PIECES), timed
    in place on one thread: hooks on the attention, MoE block and experts modules, wrappers on each expert's
    `mlp`, on `group_by_expert` and on the LM head."""
    totals: Counter = Counter()
    model = engine.model
    blocks = [layer.mlp for layer in model.layers if isinstance(layer.mlp, moe.SparseMoeBlock)]
    with decoding(engine, num_seqs, context), one_thread():
        handles = [h for layer in model.layers for h in _hook(layer.self_attn, totals, PIECES[4])]
        handles += [h for b in blocks for h in _hook(b, totals, "block") + _hook(b.experts, totals, "experts")]
        for b in blocks:
            b.experts.mlp = _timed(totals, PIECES[2], b.experts.mlp)
        moe.group_by_expert, grouping = _timed(totals, PIECES[1], moe.group_by_expert), moe.group_by_expert
        model.compute_logits = _timed(totals, PIECES[5], model.compute_logits)
        try:
            start = time.thread_time()
            for _ in range(steps):
                engine.step()
            step = (time.thread_time() - start) / steps
        finally:
            for h in handles:
                h.remove()
            for b in blocks:
                del b.experts.mlp  # back to the class's method
            del model.compute_logits
            moe.group_by_expert = grouping
    per = {k: v / steps for k, v in totals.items()}
    split = {PIECES[0]: per["block"] - per["experts"], PIECES[1]: per[PIECES[1]], PIECES[2]: per[PIECES[2]],
             PIECES[3]: per["experts"] - per[PIECES[1]] - per[PIECES[2]], PIECES[4]: per[PIECES[4]],
             PIECES[5]: per[PIECES[5]]}
    split[PIECES[6]] = step - per["block"] - per[PIECES[4]] - per[PIECES[5]]
    return {"num_seqs": num_seqs, "context": context, "step_s": step, "pieces": split}


def format_split(splits: list[dict]) -> str:
    head = "   " + f"{'piece of a decode step':42s}" + "".join(f"{str(s['num_seqs']) + ' seqs, ms':>15} {'share':>6}"
                                                            for s in splits)
    lines = [head]
    for piece in PIECES:
        lines.append("   " + f"{piece:42s}" + "".join(
            f"{s['pieces'][piece] * 1e3:15.2f} {s['pieces'][piece] / s['step_s']:6.1%}" for s in splits))
    lines.append("   " + f"{'whole step':42s}" + "".join(f"{s['step_s'] * 1e3:15.2f} {1:6.0%}" for s in splits))
    return "\n".join(lines)


def run(folder: str, requests: int = 32, rounds: int = 3, dtype: str = "auto", seed: int = 0, name: str | None = None,
        one_chat_len: tuple[int, int] = (128, 64), prompt_len=(32, 160), output_len=(32, 64)) -> dict:
    """Everything above on one checkpoint, printed; the numbers returned (JSON-ready)."""
    bench = Bench(folder, ENGINES, dtype=dtype)
    engine, cfg = bench.engine, bench.engine.hf_config
    try:
        params = parameter_counts(engine.model, cfg)
        dtype_name = str(engine.dtype).removeprefix("torch.")
        threads = torch.get_num_threads()
        print(f"\n== {name or folder} in {dtype_name}, up to {threads} thread{'s' * (threads > 1)}: {cfg.num_experts} experts, top "
              f"{cfg.num_experts_per_tok}, {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}; "
              f"{params['total'] / 1e6:.1f}M parameters ({params['experts'] / params['total']:.0%} in experts), "
              f"{params['active'] / 1e6:.1f}M active per token ({params['total'] / params['active']:.1f}x fewer)",
              flush=True)
        out = {"model": name or folder, "folder": folder, "dtype": dtype_name, "threads": threads,
               "parameters": params, "one_chat": one_chat(bench, rounds, *one_chat_len, seed=seed),
               "chats": chats(bench, requests, rounds, prompt_len, output_len, seed)}
        out["split"] = [step_split(engine, n) for n in (1, requests)]
        print("-- where a decode step's time goes (one thread, CPU time)\n" + format_split(out["split"]), flush=True)
        return out
    finally:
        bench.close()


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m nano_infer.bench.moe", description=__doc__.split("\n")[0])
    p.add_argument("--model", nargs="+", default=["olmoe-1b-7b-shape"],
                   help=f"{' or '.join(map(repr, MOE_SHAPES))} (random weights, built offline) or a checkpoint folder")
    p.add_argument("--requests", type=int, default=32, help="chats at once (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=3, help="rounds per comparison (default: %(default)s)")
    p.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16 (default: the engine's choice)")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.requests < 1:
        p.error("--rounds and --requests must be at least 1")
    return args


def main(argv=None) -> list[dict]:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    return [run(moe_folder(m), args.requests, args.rounds, args.dtype, name=m) for m in args.model]


if __name__ == "__main__":
    main()
