"""Where one engine step spends its time: `python -m nano_infer.bench.profile`.

Fills the engine with `--seqs` sequences of `--context` tokens, prefills them, then times
`--steps` decode steps piece by piece, in place: forward hooks on the model's modules and
a wrapper around the attention call record the thread's CPU time (`time.thread_time`),
which another busy process on the machine distorts far less than wall time. With one
torch thread (the default here) all of the step's work runs on this thread.

    python -m nano_infer.bench.profile --seqs 32 --context 230
    python -m nano_infer.bench.profile --model /path/to/checkpoint --attention blockwise
"""
from __future__ import annotations

import argparse
import time
from collections import Counter

import torch

from ..sampling_params import SamplingParams

PIECES = {  # module attribute path inside a decoder layer -> label
    "input_layernorm": "rmsnorm", "post_attention_layernorm": "rmsnorm", "self_attn.qkv_proj": "qkv_proj",
    "self_attn.o_proj": "o_proj", "mlp.gate_up_proj": "mlp gate_up", "mlp.down_proj": "mlp down",
}


def _timed(totals: Counter, label: str, fn):
    def wrapper(*args, **kwargs):
        start = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            totals[label] += time.thread_time() - start
    return wrapper


def _hook(module, totals: Counter, label: str) -> list:
    starts = []
    pre = module.register_forward_pre_hook(lambda *_: starts.append(time.thread_time()))
    post = module.register_forward_hook(lambda *_: totals.__setitem__(label, totals[label] + time.thread_time() - starts.pop()))
    return [pre, post]


def fill(engine, num_seqs: int, context: int, seed: int = 0) -> None:
    """Add `num_seqs` long-running requests with `context`-token prompts and run until all are decoding."""
    gen = torch.Generator().manual_seed(seed)
    params = SamplingParams(temperature=0, max_tokens=engine.max_model_len - context, ignore_eos=True)
    for i in range(num_seqs):
        ids = torch.randint(0, engine.vocab_size, (context,), generator=gen).tolist()
        engine.add_request(f"profile-{i}", prompt_token_ids=ids, params=params)
    while engine.scheduler.waiting or any(s.num_computed_tokens < s.num_prompt_tokens for s in engine.scheduler.running):
        engine.step()


def step_breakdown(engine, steps: int = 20) -> tuple[float, dict[str, float]]:
    """(CPU seconds per step, {piece: CPU seconds per step}) over `steps` engine steps, measured in place."""
    totals: Counter = Counter()
    model, runner = engine.model, engine.runner
    handles = _hook(model, totals, "model forward (all layers)")
    for layer in model.layers:
        for path, label in PIECES.items():
            module = layer
            for name in path.split("."):
                module = getattr(module, name)
            handles += _hook(module, totals, label)
    patched = {
        (runner.backend, "attend"): "attention (write KV + read through block table)",
        (runner, "pack"): "runner.prepare (pack the step)",
        (runner, "build"): "runner.prepare (pack the step)",
        (engine.scheduler, "schedule"): "scheduler.schedule",
        (model, "compute_logits"): "lm_head (compute_logits)",
        (model.rotary, "lookup"): "rotary cos/sin lookup",
    }
    originals = {}
    for (obj, name), label in patched.items():
        originals[obj, name] = getattr(obj, name)
        setattr(obj, name, _timed(totals, label, originals[obj, name]))
    try:
        start = time.thread_time()
        for _ in range(steps):
            engine.step()
        total = time.thread_time() - start
    finally:
        for h in handles:
            h.remove()
        for (obj, name) in patched:
            delattr(obj, name)  # back to the class's method
    return total / steps, {k: v / steps for k, v in totals.items()}


def main(argv=None):
    from ..engine import LLMEngine
    from ..models.loader import default_model

    p = argparse.ArgumentParser(prog="python -m nano_infer.bench.profile", description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="checkpoint folder or hub id (default: default_model())")
    p.add_argument("--seqs", type=int, default=32)
    p.add_argument("--context", type=int, default=230)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--attention", default="gather", choices=["gather", "blockwise"])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    engine = LLMEngine(args.model or default_model(), attention=args.attention, max_num_seqs=max(64, args.seqs),
                       dtype=args.dtype)
    fill(engine, args.seqs, args.context)
    engine.step()  # one warm step outside the measurement
    per_step, pieces = step_breakdown(engine, args.steps)
    print(f"{args.seqs} sequences decoding at ~{args.context} tokens of context, {engine.dtype}, attention={args.attention!r}, "
          f"{args.threads} thread(s): {per_step * 1e3:.2f} ms CPU per step = {args.seqs / per_step:.0f} tokens per CPU-second")
    for label, seconds in sorted(pieces.items(), key=lambda kv: -kv[1]):
        print(f"  {label:50s} {seconds * 1e3:8.3f} ms  {seconds / per_step:6.1%}")
    rest = per_step - pieces.get("model forward (all layers)", 0) - sum(
        pieces.get(k, 0) for k in ("lm_head (compute_logits)", "runner.prepare (pack the step)", "scheduler.schedule"))
    print(f"  {'rest of engine.step (sampling, bookkeeping)':50s} {rest * 1e3:8.3f} ms  {rest / per_step:6.1%}")


if __name__ == "__main__":
    main()
