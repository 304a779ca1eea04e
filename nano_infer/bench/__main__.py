"""`python -m nano_infer.bench` (`make bench`): nano_infer vs transformers, same weights, same process.

    python -m nano_infer.bench                        # shipped model (32 and 128 requests), then the 0.5B shape
    python -m nano_infer.bench --quick                # a smoke run: shipped model, 8 short requests, 1 round
    python -m nano_infer.bench --model qwen2.5-0.5b-shape --requests 32 --rounds 1
    python -m nano_infer.bench --model /path/to/hf/checkpoint --engines nano_infer hf_continuous

Prints a table per workload and writes everything (every round, medians, ratios, the
machine) to bench_results/bench-<time>.json. The default run takes about 6 minutes on an
idle 2-core CPU (most of it transformers on the 0.5B shape); a loaded machine stretches
the wall times, which is why the ratios are taken per round and also per CPU-second.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

from ..models.loader import default_model, resolve_model_dir
from .compare import ENGINES, Bench, device_name
from .random_model import random_qwen2_model
from .roofline import decode_throughput, matmul_gflops

SHAPE_0_5B = "qwen2.5-0.5b-shape"
# per model: request counts and length ranges; the 0.5B shape is ~70x the work per token
PRESETS = {
    "default": dict(requests=[32, 128], prompt_len=(16, 192), output_len=(32, 96), rounds=3),
    SHAPE_0_5B: dict(requests=[32], prompt_len=(16, 128), output_len=(32, 64), rounds=1),
    "quick": dict(requests=[8], prompt_len=(16, 64), output_len=(8, 16), rounds=1),
}
COLUMNS = [("tokens_per_s", "tok/s", "{:9.1f}"), ("tokens_per_cpu_s", "tok/CPU-s", "{:9.1f}"), ("ttft_p50_ms", "TTFT p50 ms", "{:11.0f}"),
           ("ttft_p99_ms", "TTFT p99 ms", "{:11.0f}"), ("itl_p50_ms", "ITL p50 ms", "{:10.1f}"),
           ("itl_p99_ms", "ITL p99 ms", "{:10.1f}"), ("kv_reserved_mb", "KV rsv MB", "{:9.1f}"),
           ("kv_used_mb", "KV used MB", "{:10.1f}"), ("kv_pool_mb", "pool MB", "{:7.1f}")]


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m nano_infer.bench", description=__doc__.split("\n")[0])
    p.add_argument("--model", nargs="+", default=["default", SHAPE_0_5B],
                   help=f"'default' (the shipped model, or NANO_INFER_MODEL), '{SHAPE_0_5B}' (random weights, "
                        "built offline), or a checkpoint folder")
    p.add_argument("--requests", type=int, nargs="+", help="request counts (default: per model, see PRESETS)")
    p.add_argument("--rounds", type=int, help="rounds per workload, medians reported (default: per model, see PRESETS)")
    p.add_argument("--engines", nargs="+", default=list(ENGINES), choices=ENGINES)
    p.add_argument("--static-batch-size", type=int, default=8)
    p.add_argument("--attention", default="gather", choices=["gather", "blockwise"])
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="8 short requests, 1 round, default model only")
    p.add_argument("--out", default="bench_results", help="folder for the JSON report")
    args = p.parse_args(argv)
    if args.quick and args.model == p.get_default("model"):
        args.model = ["default"]
    return args


def model_folder(name: str) -> tuple[Path, str]:
    """(checkpoint folder, preset name) for a --model value."""
    if name == "default":
        return resolve_model_dir(default_model()), "default"
    if name == SHAPE_0_5B:
        print(f"building (or reusing) a random-weight {SHAPE_0_5B} model ...", flush=True)
        return random_qwen2_model(resolve_model_dir(default_model())), SHAPE_0_5B
    return resolve_model_dir(name), "default"


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


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    report = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "argv": sys.argv[1:], "device": device_name(),
              "platform": platform.platform(), "torch": torch.__version__, "models": []}
    try:
        import transformers
        report["transformers"] = transformers.__version__
    except ImportError:
        pass
    for name in args.model:
        folder, preset_name = model_folder(name)
        preset = PRESETS["quick" if args.quick else preset_name]
        bench = Bench(folder, args.engines, args.static_batch_size, attention=args.attention)
        cfg = bench.engine.hf_config
        params = sum(p.numel() for p in bench.engine.model.parameters())
        print(f"\n== {name}: {folder} ({params / 1e6:.1f}M params, {cfg.num_hidden_layers} layers, "
              f"hidden {cfg.hidden_size}) on {report['device']}", flush=True)
        gflops = matmul_gflops(dtype=bench.engine.dtype, device=bench.engine.device)
        entry = {"model": name, "folder": str(folder), "params": params, "workloads": [],
                 "nano_options": {"attention": args.attention, "max_num_seqs": bench.engine.config.max_num_seqs,
                                  "max_num_batched_tokens": bench.engine.config.max_num_batched_tokens,
                                  "block_size": bench.engine.config.block_size,
                                  "prefix_cache": type(bench.engine.prefix_cache).__name__}}
        for n in args.requests or preset["requests"]:
            print(f"-- {n} requests, prompts {preset['prompt_len']}, outputs {preset['output_len']} tokens", flush=True)
            result = bench.run(n, args.rounds or preset["rounds"], args.seed, preset["prompt_len"], preset["output_len"])
            # the roofline peak is re-measured after each workload and the best kept: load only ever lowers it
            gflops = max(gflops, matmul_gflops(dtype=bench.engine.dtype, device=bench.engine.device))
            ceiling = result["output_tokens"] * gflops * 1e9 / result["work_flops"]
            result.update(matmul_gflops=gflops, ceiling_tokens_per_s=ceiling, of_ceiling={
                engine: row["tokens_per_s"] / ceiling for engine, row in result["median"].items()})
            entry["workloads"].append(result)
            print(format_table(result), flush=True)
        if "nano_infer" in args.engines:
            entry["decode"] = decode_roofline(bench, max(args.requests or preset["requests"]), preset["prompt_len"], gflops)
        bench.close()
        report["models"].append(entry)
        del bench
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"bench-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(report, indent=1))
    print(f"\nwrote {path}")
    return report


if __name__ == "__main__":
    main()
