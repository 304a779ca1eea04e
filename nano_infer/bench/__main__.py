"""`python -m nano_infer.bench` (`make bench`): nano_infer vs transformers, same weights, same dtype, same process.

    python -m nano_infer.bench                        # shipped model, then the SmolLM2-135M and Qwen2.5-0.5B shapes,
                                                      # each in float32 and in bfloat16
    python -m nano_infer.bench --quick                # a smoke run: shipped model, 8 short requests, 1 round
    python -m nano_infer.bench --model smollm2-135m-shape --requests 32 --rounds 1 --dtype bfloat16
    python -m nano_infer.bench --model .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf --engines nano_infer hf_continuous

Prints a table per workload, a one-chat latency line per model and dtype, a summary, then
one chat against llama.cpp on the same GGUF file with the decode roofline beside it
(`llamacpp.py`; when llama-cpp-python is installed: `make llama-cpp`; else a line says it was skipped),
and last a Mixture-of-Experts shape against transformers' continuous batching, one chat and 32 (`moe.py`);
writes everything (every round, medians, ratios, the machine) to
bench_results/bench-<time>.json. The default run took 18 minutes on an idle 2-core CPU (most
of it transformers on the two real shapes), before the Mixture-of-Experts comparison was added (a few minutes
more); a loaded machine stretches the wall times, which is
why the ratios are taken per round and also per CPU-second.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

from ..models.loader import pick_dtype
from . import llamacpp
from . import moe as moe_bench
from .compare import ENGINES, Bench, device_name
from .presets import DTYPES, PRESETS, SHAPES, model_folder
from .profile import KERNELS
from .roofline import decode_throughput, matmul_gflops

DEFAULT_MODELS = ["default", "smollm2-135m-shape", "qwen2.5-0.5b-shape"]  # the 1.5B shape is for a GPU (scripts/gpu_check.sh)
COLUMNS = [("tokens_per_s", "tok/s", "{:9.1f}"), ("tokens_per_cpu_s", "tok/CPU-s", "{:9.1f}"), ("ttft_p50_ms", "TTFT p50 ms", "{:11.0f}"),
           ("ttft_p99_ms", "TTFT p99 ms", "{:11.0f}"), ("itl_p50_ms", "ITL p50 ms", "{:10.1f}"),
           ("itl_p99_ms", "ITL p99 ms", "{:10.1f}"), ("kv_reserved_mb", "KV rsv MB", "{:9.1f}"),
           ("kv_used_mb", "KV used MB", "{:10.1f}"), ("kv_pool_mb", "pool MB", "{:7.1f}")]


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m nano_infer.bench", description=__doc__.split("\n")[0])
    p.add_argument("--model", nargs="+", default=DEFAULT_MODELS,
                   help=f"'default' (the shipped model, or NANO_INFER_MODEL), {' or '.join(map(repr, SHAPES))} "
                        "(random weights, built offline), a checkpoint folder or a .gguf file")
    p.add_argument("--requests", type=int, nargs="+", help="request counts (default: per model, see PRESETS)")
    p.add_argument("--rounds", type=int, help="rounds per workload, medians reported (default: per model, see PRESETS)")
    p.add_argument("--prompt-len", type=int, nargs=2, metavar=("MIN", "MAX"), help="prompt lengths (default: per model)")
    p.add_argument("--output-len", type=int, nargs=2, metavar=("MIN", "MAX"), help="output lengths (default: per model)")
    p.add_argument("--dtype", nargs="+", help="dtypes to run, each for both engines (default: per model, "
                   f"see PRESETS: {' and '.join(DTYPES)}); 'auto' is the engine's own choice")
    p.add_argument("--engines", nargs="+", default=list(ENGINES), choices=ENGINES)
    p.add_argument("--static-batch-size", type=int, default=8)
    p.add_argument("--attention", default="gather", choices=["gather", "blockwise"])
    p.add_argument("--quantization", choices=["none", "gguf", "int8", "int4"],
                   help="nano_infer's `quantization` (default: the engine's own choice)")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--compile-sizes", type=int, nargs="+", metavar="N", help="the batch sizes nano_infer's CPU decode "
                   "step is compiled for (compilation_config's compile_sizes; default: the engine's), all compiled "
                   "before the first round")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.5,
                   help="on a GPU, the share of its memory nano_infer may fill (weights + KV pool); the rest is left "
                        "for transformers' own cache (default: 0.5)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-latency", action="store_true", help="skip the one-chat latency case")
    p.add_argument("--llama-cpp-model", default=str(llamacpp.DEFAULT_GGUF),
                   help="the GGUF file of the one-chat comparison with llama.cpp (default: %(default)s)")
    p.add_argument("--llama-cpp-rounds", type=int, default=3, help="rounds of that comparison (default: 3)")
    p.add_argument("--no-llama-cpp", action="store_true", help="skip the one-chat comparison with llama.cpp "
                   "(a --quick run skips it too)")
    p.add_argument("--moe-model", default="olmoe-1b-7b-shape", help="the Mixture-of-Experts model of the last "
                   f"comparison: {' or '.join(map(repr, moe_bench.MOE_SHAPES))} or a checkpoint folder (default: %(default)s)")
    p.add_argument("--no-moe", action="store_true", help="skip the Mixture-of-Experts comparison (a --quick run skips it too)")
    p.add_argument("--quick", action="store_true", help="8 short requests, 1 round, the engine's dtype, default model only")
    p.add_argument("--out", default="bench_results", help="folder for the JSON report")
    args = p.parse_args(argv)
    if args.quick and args.model == p.get_default("model"):
        args.model = ["default"]
    return args


def format_table(result: dict) -> str:
    head = f"{'engine':>15} " + " ".join(f"{title:>{len(fmt.format(0))}}" for _, title, fmt in COLUMNS)
    lines = [head]
    for name, row in result["median"].items():
        cells = [fmt.format(row[key]) if row.get(key) is not None else f"{'-':>{len(fmt.format(0))}}"
                 for key, _, fmt in COLUMNS]
        lines.append(f"{name:>15} " + " ".join(cells))
    for name, r in result["ratios"].items():
        lines.append(f"  {name}: {r['median']:.2f}x tok/s (rounds: {r['min']:.2f}-{r['max']:.2f}), "
                     f"{r['cpu_median']:.2f}x tok/CPU-s")
    if "ceiling_tokens_per_s" in result:
        shares = ", ".join(f"{name} {share:.1%}" for name, share in result["of_ceiling"].items())
        lines.append(f"  ceiling: the workload is {result['work_flops'] / 1e9:.1f} GFLOP (prefill + decode); at "
                     f"{result['matmul_gflops']:.0f} GFLOP/s no engine exceeds {result['ceiling_tokens_per_s']:.0f} tok/s here. "
                     f"Reached: {shares}")
        for name, share in result["of_ceiling"].items():
            if name != "nano_infer":
                lines.append(f"  => no engine can be more than {1 / share:.1f}x {name} on this workload and machine")
    if "kernel_floor" in result:
        floor, kinds = result["kernel_floor"], result["kernel_floor"]["seconds"]
        spent = ", ".join(f"{kind.split(' (')[0]} {kinds[kind]:.3g} s" for kind in dict.fromkeys(KERNELS.values()))
        lines.append(f"  kernel floor (a {floor['profiled_wall_s']:.3g} s profiled run): {spent}; these kernels alone "
                     f"cap nano_infer's batches at {floor['tokens_per_s']:.0f} tok/s" + "".join(
                         f" = {ratio:.1f}x {name}" for name, ratio in floor["ratios"].items()))
    return "\n".join(lines)


def decode_roofline(bench: Bench, num_seqs: int, prompt_len: tuple[int, int], gflops: float) -> dict:
    """nano_infer decoding alone (no prefill, no stragglers): a full batch at the workload's mean prompt length."""
    num_seqs = min(num_seqs, bench.engine.config.max_num_seqs)
    decode = decode_throughput(bench.engine, num_seqs, sum(prompt_len) // 2)
    per_token = bench.decode_flops_per_token(decode["context"])
    decode.update(flops_per_token=per_token, matmul_gflops=gflops,
                  roofline=decode["tokens_per_s"] * per_token / (gflops * 1e9),
                  # per CPU-second against one thread's share of the peak: what load on the machine distorts least
                  roofline_cpu=decode["tokens_per_cpu_s"] * per_token * torch.get_num_threads() / (gflops * 1e9))
    print(f"-- nano_infer decode alone, {num_seqs} sequences at ~{decode['context']} tokens: "
          f"{decode['tokens_per_s']:.1f} tok/s ({decode['tokens_per_cpu_s']:.1f} per CPU-s) = "
          f"{decode['roofline']:.1%} of the matmul roofline ({decode['roofline_cpu']:.1%} per CPU-second; "
          f"{per_token / 1e9:.3f} GFLOP/token, {gflops:.0f} GFLOP/s)", flush=True)
    return decode


def run_model(args, name: str, folder: str, preset: dict, dtype: str, report: dict) -> dict:
    """Every workload of one model in one dtype, both engines in that dtype; the ceiling from a matmul in it."""
    options = {"quantization": args.quantization} if args.quantization else {}
    if args.compile_sizes:
        options["compilation_config"] = {"compile_sizes": args.compile_sizes}
    bench = Bench(folder, args.engines, args.static_batch_size, attention=args.attention, dtype=dtype,
                  gpu_memory_utilization=args.gpu_memory_utilization, **options)
    cfg, engine = bench.engine.hf_config, bench.engine
    params = sum(p.numel() for p in engine.model.parameters())
    dtype_name = str(engine.dtype).removeprefix("torch.")
    print(f"\n== {name} in {dtype_name}: {folder} ({params / 1e6:.1f}M params, {cfg.num_hidden_layers} layers, "
          f"hidden {cfg.hidden_size}, vocab {cfg.vocab_size}) on {report['device']}", flush=True)
    gflops = matmul_gflops(dtype=engine.dtype, device=engine.device)
    entry = {"model": name, "folder": folder, "dtype": dtype_name, "params": params, "workloads": [],
             "nano_options": {"attention": args.attention, "max_num_seqs": engine.config.max_num_seqs,
                              "max_num_batched_tokens": engine.config.max_num_batched_tokens,
                              "block_size": engine.config.block_size, "prefix_cache": type(engine.prefix_cache).__name__,
                              "compilation_config": engine.config.compilation_config}}
    for n in args.requests or preset["requests"]:
        print(f"-- {n} requests, prompts {preset['prompt_len']}, outputs {preset['output_len']} tokens", flush=True)
        result = bench.run(n, args.rounds or preset["rounds"], args.seed, preset["prompt_len"], preset["output_len"],
                           static=n <= preset.get("static_max_requests", n))
        # the roofline peak is re-measured after each workload and the best kept: load only ever lowers it
        gflops = max(gflops, matmul_gflops(dtype=engine.dtype, device=engine.device))
        ceiling = result["output_tokens"] * gflops * 1e9 / result["work_flops"]
        result.update(matmul_gflops=gflops, ceiling_tokens_per_s=ceiling, of_ceiling={
            e: row["tokens_per_s"] / ceiling for e, row in result["median"].items()})
        if "nano_infer" in args.engines and engine.device.type == "cpu" and args.compile_sizes:
            print("  kernel floor: not measured with --compile-sizes (it counts the eager step's torch ops by name, and "
                  "a compiled step calls its kernels from generated code)", flush=True)
        elif "nano_infer" in args.engines and engine.device.type == "cpu":
            floor = bench.kernel_floor(n, (args.rounds or preset["rounds"]) + 1, args.seed,
                                       preset["prompt_len"], preset["output_len"])
            floor["ratios"] = {e: floor["tokens_per_s"] / row["tokens_per_s"]  # the most each ratio can reach
                               for e, row in result["median"].items() if e != "nano_infer"}
            result["kernel_floor"] = floor
        entry["workloads"].append(result)
        print(format_table(result), flush=True)
    if "nano_infer" in args.engines:
        if not args.no_latency:
            entry["latency"] = bench.latency(*preset["latency"], rounds=max(3, args.rounds or preset["rounds"]), seed=args.seed)
        entry["decode"] = decode_roofline(bench, max(args.requests or preset["requests"]), preset["prompt_len"], gflops)
    bench.close()
    return entry


def summarize(models: list[dict]) -> list[str]:
    """The headline per model and workload: each dtype's ratio over transformers' continuous batching (and the
    ratio the kernel floor allows, where there is one) and share of that dtype's ceiling, then bfloat16's
    speed-up over float32 for nano_infer."""
    lines, by_key = [], {}
    for entry in models:
        for w in entry["workloads"]:
            by_key.setdefault((entry["model"], w["num_requests"]), {})[entry["dtype"]] = w
    for (model, n), per_dtype in by_key.items():
        parts = []
        for dtype, w in per_dtype.items():
            cb = w["ratios"].get("nano_infer / hf_continuous", {}).get("median")
            cb_floor = w.get("kernel_floor", {}).get("ratios", {}).get("hf_continuous")
            parts.append(f"{dtype}: {w['median']['nano_infer']['tokens_per_s']:.1f} tok/s"
                         + (f", {cb:.2f}x transformers CB" if cb else "")
                         + (f" (kernel floor {cb_floor:.1f}x)" if cb_floor else "") + f", {w['of_ceiling']['nano_infer']:.0%} of ceiling")
        if {"float32", "bfloat16"} <= set(per_dtype):
            fp32, bf16 = (per_dtype[d]["median"]["nano_infer"]["tokens_per_s"] for d in ("float32", "bfloat16"))
            parts.append(f"bfloat16 / float32 = {bf16 / fp32:.2f}x")
        lines.append(f"{model}, {n} requests: " + "; ".join(parts))
    return lines


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    auto = str(pick_dtype(torch.device("cuda" if torch.cuda.is_available() else "cpu"), "auto")[0]).removeprefix("torch.")
    report = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "argv": sys.argv[1:], "device": device_name(),
              "platform": platform.platform(), "torch": torch.__version__, "auto_dtype": auto, "models": []}
    try:
        import transformers
        report["transformers"] = transformers.__version__
    except ImportError:
        pass
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"bench-{time.strftime('%Y%m%d-%H%M%S')}.json"
    for name in args.model:
        folder, preset_name = model_folder(name)
        preset = dict(PRESETS["quick" if args.quick else preset_name])
        preset.update({k: tuple(getattr(args, k)) for k in ("prompt_len", "output_len") if getattr(args, k)})
        for dtype in args.dtype or preset["dtypes"]:
            report["models"].append(run_model(args, name, folder, preset, dtype, report))
            report["summary"] = summarize(report["models"])
            path.write_text(json.dumps(report, indent=1))  # after each model and dtype: a long run keeps what it did
    print(f"\n== summary (dtype='auto' here is {auto})", *report["summary"], sep="\n")
    if not (args.no_llama_cpp or args.quick):
        print("\n== one chat against llama.cpp", flush=True)
        report["llama_cpp"] = llamacpp.run_or_explain(args.llama_cpp_model, rounds=args.llama_cpp_rounds,
                                                      threads=args.threads or 2)
        path.write_text(json.dumps(report, indent=1))
    if not (args.no_moe or args.quick):
        print("\n== a Mixture-of-Experts model against transformers' continuous batching", flush=True)
        report["moe"] = moe_bench.run(moe_bench.moe_folder(args.moe_model), name=args.moe_model)
        path.write_text(json.dumps(report, indent=1))
    print(f"\nwrote {path}")
    return report


if __name__ == "__main__":
    main()
