"""Where the engine spends its time: `python -m nano_infer.bench.profile`.

By default, one decode step: fills the engine with `--seqs` sequences of `--context`
tokens, prefills them, then times `--steps` decode steps piece by piece, in place: forward
hooks on the model's modules and a wrapper around the attention call record the thread's
CPU time (`time.thread_time`), which another busy process on the machine distorts far less
than wall time. With one torch thread (the default here) all of the step's work runs on
this thread.

With `--workload N`, a whole benchmark workload (N requests at t=0, prefill and decode) by
kind of kernel, from torch.profiler: matmuls, the attention kernel, the K/V gather and
write, every other op, and the time outside ops (Python, the engine's bookkeeping). The
first three are a floor for this engine's batching on this machine: however lean the rest,
the workload cannot finish faster than its kernels run.

    python -m nano_infer.bench.profile --seqs 32 --context 230
    python -m nano_infer.bench.profile --model /path/to/checkpoint --attention blockwise
    python -m nano_infer.bench.profile --model smollm2-135m-shape --workload 32 --dtype bfloat16
"""
from __future__ import annotations

import argparse
import contextlib
import time
from collections import Counter

import torch

from ..sampling_params import SamplingParams
from .presets import PRESETS, model_folder
from .quiet_profile import profiled
from .throughput import run_nano
from .workload import make_workload, ordinary_token_ids

PIECES = {  # module attribute path inside a decoder layer -> label
    "input_layernorm": "rmsnorm", "post_attention_layernorm": "rmsnorm", "self_attn.qkv_proj": "qkv_proj",
    "self_attn.o_proj": "o_proj", "mlp.gate_up_proj": "mlp gate_up", "mlp.down_proj": "mlp down",
}


KERNELS = {  # profiler op name -> kind of kernel (every other op is "other ops")
    "aten::mm": "matmul", "aten::addmm": "matmul", "aten::bmm": "matmul", "mkldnn::_linear_pointwise": "matmul",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "attention kernel",
    "aten::index_select": "index_select (K/V gather, embedding)", "aten::index_copy_": "index_copy_ (K/V write)",
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


@contextlib.contextmanager
def decoding(engine, num_seqs: int, context: int, seed: int = 0):
    """`fill` the engine and take one warm step; inside, every step is a steady decode of `num_seqs` sequences.
    The requests are aborted afterwards, leaving the engine empty."""
    fill(engine, num_seqs, context, seed)
    engine.step()  # warm
    try:
        yield
    finally:
        for request_id in list(engine.requests):
            engine.abort_request(request_id)


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


def workload_breakdown(engine, workload) -> tuple[float, dict[str, float]]:
    """(wall seconds, {kind: seconds}) for one run of `workload` through `engine` under torch.profiler.

    Op self-times on the calling thread, whose ops fan out to the intra-op threads and wait
    for them, so the kinds add up to wall time; "outside ops" is the rest. CPU only: on a GPU
    the profiler's CPU times are launch times, not kernel times.
    """
    with profiled() as prof:
        result = run_nano(engine, workload)
    kinds: Counter = Counter()
    for op in prof.key_averages():
        kinds[KERNELS.get(op.key, "other ops")] += op.self_cpu_time_total / 1e6
    kinds["outside ops (Python, engine bookkeeping)"] = max(0.0, result.wall_s - sum(kinds.values()))
    return result.wall_s, dict(kinds)


def kernel_seconds(kinds: dict[str, float]) -> float:
    """The matmuls, attention kernel and K/V gather and write of a `workload_breakdown`: what trimming the rest
    (elementwise ops, Python) leaves untouched."""
    return sum(seconds for kind, seconds in kinds.items() if kind in KERNELS.values())


def print_workload_breakdown(engine, args) -> None:
    ids = ordinary_token_ids(engine.tokenizer)
    lengths = dict(prompt_len=tuple(args.prompt_len), output_len=tuple(args.output_len))
    run_nano(engine, make_workload(4, ids, round=-1, prompt_len=lengths["prompt_len"], output_len=(4, 8)))  # warm
    plain = run_nano(engine, make_workload(args.workload, ids, round=1, **lengths)).wall_s
    workload = make_workload(args.workload, ids, round=2, **lengths)  # fresh prompts: no prefix-cache hits
    wall, kinds = workload_breakdown(engine, workload)
    dtype = str(engine.dtype).removeprefix("torch.")
    print(f"{args.workload} requests (prompts {args.prompt_len[0]}-{args.prompt_len[1]}, outputs {args.output_len[0]}-"
          f"{args.output_len[1]} tokens), {dtype}, {torch.get_num_threads()} thread(s): "
          f"{wall:.2f} s under the profiler, {plain:.2f} s without")
    for kind, seconds in sorted(kinds.items(), key=lambda kv: -kv[1]):
        print(f"  {kind:45s} {seconds:8.3f} s  {seconds / wall:6.1%}")
    floor = kernel_seconds(kinds)
    print(f"  matmul, attention kernel, K/V gather and write alone: {floor:.2f} s = at most "
          f"{workload.num_output_tokens / floor:.0f} tok/s with these kernels at this engine's batch shapes")


def main(argv=None):
    from ..engine.llm_engine import LLMEngine

    p = argparse.ArgumentParser(prog="python -m nano_infer.bench.profile", description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="checkpoint folder, hub id or a bench shape such as "
                   "'smollm2-135m-shape' (default: default_model())")
    p.add_argument("--seqs", type=int, default=32)
    p.add_argument("--context", type=int, default=230)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--attention", default="gather", choices=["gather", "blockwise"])
    p.add_argument("--threads", type=int, help="torch CPU threads (default: 1 for decode steps, so the thread's CPU "
                   "time is all of the step's; torch's choice for --workload, as `make bench` runs)")
    p.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16")
    p.add_argument("--workload", type=int, metavar="N",
                   help="profile a whole workload of N requests instead of decode steps")
    for flag in ("--prompt-len", "--output-len"):
        p.add_argument(flag, type=int, nargs=2, metavar=("MIN", "MAX"), help="(default: the model's bench preset)")
    args = p.parse_args(argv)
    if args.threads or not args.workload:
        torch.set_num_threads(args.threads or 1)
    model, preset = model_folder(args.model or "default")  # a bench shape is built (once) from random weights
    if args.workload:  # the engine's own limits and the bench's lengths, as `make bench` runs them
        args.prompt_len = args.prompt_len or PRESETS[preset]["prompt_len"]
        args.output_len = args.output_len or PRESETS[preset]["output_len"]
        return print_workload_breakdown(LLMEngine(model, attention=args.attention, dtype=args.dtype), args)
    engine = LLMEngine(model, attention=args.attention, max_num_seqs=max(64, args.seqs), dtype=args.dtype)
    fill(engine, args.seqs, args.context)
    engine.step()  # one warm step outside the measurement
    per_step, pieces = step_breakdown(engine, args.steps)
    print(f"{args.seqs} sequences decoding at ~{args.context} tokens of context, {engine.dtype}, attention={args.attention!r}, "
          f"{torch.get_num_threads()} thread(s): {per_step * 1e3:.2f} ms CPU per step = {args.seqs / per_step:.0f} tokens per CPU-second")
    for label, seconds in sorted(pieces.items(), key=lambda kv: -kv[1]):
        print(f"  {label:50s} {seconds * 1e3:8.3f} ms  {seconds / per_step:6.1%}")
    rest = per_step - pieces.get("model forward (all layers)", 0) - sum(
        pieces.get(k, 0) for k in ("lm_head (compute_logits)", "runner.prepare (pack the step)", "scheduler.schedule"))
    print(f"  {'rest of engine.step (sampling, bookkeeping)':50s} {rest * 1e3:8.3f} ms  {rest / per_step:6.1%}")


if __name__ == "__main__":
    main()
