"""One model, several engines, the same workloads: rounds alternate the engines, results are medians.

Another process on the machine can slow torch several times over for a while, so
absolute numbers drift between runs. Within one round the engines run back to back on
the same prompts, and the engine order rotates each round; the ratio of two engines is
taken per round and its median reported, which is far steadier than either throughput.
"""
from __future__ import annotations

import statistics
from pathlib import Path

import torch

from ..models.quantization import INT4_MAX_ROWS
from .profile import kernel_seconds, workload_breakdown
from .roofline import flops_per_token, workload_flops
from .throughput import HFContinuous, run_hf_static, run_nano
from .workload import Workload, make_workload, ordinary_token_ids

ENGINES = ("nano_infer", "hf_static", "hf_continuous")


class Bench:
    """nano_infer and (optionally) transformers loaded once on the same weights, ready to run workloads."""

    def __init__(self, model_dir: str | Path, engines=ENGINES, static_batch_size: int = 8, **nano_options):
        from transformers import AutoModelForCausalLM

        from ..engine.llm_engine import LLMEngine

        unknown = set(engines) - set(ENGINES)
        if unknown:
            raise ValueError(f"unknown engine(s) {sorted(unknown)}; choose from {ENGINES}")
        self.engines = tuple(engines)
        self.static_batch_size = static_batch_size
        self.engine = LLMEngine(str(model_dir), **nano_options)
        if self.engine.config.kv_cache != "paged":
            raise ValueError("the benchmark drives the paged engine (kv_cache='paged')")
        self.engine.warm_up()  # its compiled decode steps, if any, before any round: as a server starts
        self.hf = None
        if any(e.startswith("hf_") for e in self.engines):
            self.hf = AutoModelForCausalLM.from_pretrained(
                self.engine.model_dir, gguf_file=self.engine.gguf_file, dtype=self.engine.dtype,
                attn_implementation="sdpa").to(self.engine.device).eval()
        tok = self.engine.tokenizer
        self.pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        self.token_ids = ordinary_token_ids(tok)

    def _runners(self, workload: Workload, static: bool = True) -> dict:
        runners = {}
        if "nano_infer" in self.engines:
            runners["nano_infer"] = lambda w: run_nano(self.engine, w)
        if "hf_static" in self.engines and static:
            runners[f"hf_static_b{self.static_batch_size}"] = lambda w: run_hf_static(
                self.hf, w, self.static_batch_size, self.pad_token_id)
        if "hf_continuous" in self.engines:
            cb = HFContinuous(self.hf, workload, self.engine.config.max_num_batched_tokens)
            runners["hf_continuous"] = cb.run
        return runners

    def run(self, num_requests: int, rounds: int = 3, seed: int = 0, prompt_len=(16, 192), output_len=(32, 96),
            log=print, static: bool = True) -> dict:
        """Warm every engine up, then `rounds` rounds on fresh prompts of the same shape. JSON-ready result.

        `static=False` leaves out transformers' static batches: they run one after another, so their tokens/s
        at 128 requests is what it is at 32, and they are the slowest engine to wait for."""
        def workload(round, n=num_requests, out=output_len):
            return make_workload(n, self.token_ids, seed, round, prompt_len, out)

        shape = workload(0)
        runners = self._runners(shape, static)
        for name, run in runners.items():  # first calls pay for allocation and lazy init (DenseCopies: a batch)
            run(workload(-1, n=min(2 * INT4_MAX_ROWS, num_requests), out=(4, 8)))
        names = list(runners)
        per_round = {name: [] for name in names}
        for r in range(rounds):
            for name in names[r % len(names):] + names[: r % len(names)]:
                result = runners[name](workload(r + 1))
                per_round[name].append(result.summary())
                log(f"  round {r + 1}/{rounds} {name:>15}: {result.tokens_per_s:8.1f} tok/s")
        return {
            "num_requests": num_requests, "prompt_len": list(prompt_len), "output_len": list(output_len), "seed": seed,
            "prompt_tokens": shape.num_prompt_tokens, "output_tokens": shape.num_output_tokens, "rounds": rounds,
            "mean_decode_context": mean_decode_context(shape),
            "work_flops": workload_flops(self.engine.hf_config, [(len(r.prompt_token_ids), r.max_tokens) for r in shape.requests]),
            "median": {name: median_summary(rows) for name, rows in per_round.items()},
            "ratios": ratios(per_round),
            "per_round": per_round,
        }

    def latency(self, prompt_len: int, output_len: int, rounds: int = 3, seed: int = 0, log=print) -> dict:
        """One request alone, what a learner chatting with the model feels: time to the first token and ms per
        output token after it, nano_infer vs transformers `generate()` on the same prompt, alternating, medians."""
        def workload(round):
            return make_workload(1, self.token_ids, seed, round, (prompt_len, prompt_len), (output_len, output_len))

        runners = {"nano_infer": lambda w: run_nano(self.engine, w)}
        if self.hf is not None:
            runners["hf_generate"] = lambda w: run_hf_static(self.hf, w, 1, self.pad_token_id, name="hf_generate")
        for run in runners.values():
            run(make_workload(1, self.token_ids, seed, -1, (prompt_len, prompt_len), (4, 4)))  # warm-up
        per_round = {name: [] for name in runners}
        for r in range(rounds):
            for name in list(runners)[r % len(runners):] + list(runners)[: r % len(runners)]:
                per_round[name].append(runners[name](workload(r + 1)).summary())
        median = {name: median_summary(rows) for name, rows in per_round.items()}
        result = {"prompt_len": prompt_len, "output_len": output_len, "rounds": rounds,
                  "ms_per_token": {name: row["itl_mean_ms"] for name, row in median.items()},
                  "ttft_ms": {name: row["ttft_p50_ms"] for name, row in median.items()}, "per_round": per_round}
        log("-- one chat alone, " + f"{prompt_len}-token prompt, {output_len} tokens: " + ", ".join(
            f"{name} {ms:.1f} ms/token (TTFT {result['ttft_ms'][name]:.0f} ms)" for name, ms in result["ms_per_token"].items()))
        return result

    def kernel_floor(self, num_requests: int, round: int, seed: int = 0, prompt_len=(16, 192),
                     output_len=(32, 96)) -> dict:
        """One more nano_infer run of the workload, on fresh prompts, under torch.profiler: seconds per kind of
        kernel (`profile.workload_breakdown`) and the tokens/s the matmuls, attention kernel and K/V gather and
        write alone would allow, which no trimming of the rest can pass with this engine's batches (CPU only)."""
        workload = make_workload(num_requests, self.token_ids, seed, round, prompt_len, output_len)
        wall, kinds = workload_breakdown(self.engine, workload)
        return {"profiled_wall_s": wall, "seconds": kinds,
                "tokens_per_s": workload.num_output_tokens / kernel_seconds(kinds)}

    def decode_flops_per_token(self, context_len: float) -> float:
        return flops_per_token(self.engine.hf_config, context_len)

    def close(self) -> None:
        if self.hf is not None:
            self.hf.destroy_cached_continuous_batching_manager()


def mean_decode_context(workload: Workload) -> float:
    """Average number of keys the forward pass that produces an output token attends over.

    Output token i (from 1) comes out of the pass over position prompt + i - 2, which sees prompt + i - 1 keys.
    """
    total = sum(len(r.prompt_token_ids) * r.max_tokens + r.max_tokens * (r.max_tokens - 1) / 2 for r in workload.requests)
    return total / workload.num_output_tokens


def median_summary(rows: list[dict]) -> dict:
    out = {}
    for key, value in rows[0].items():
        values = [row[key] for row in rows]
        out[key] = statistics.median(values) if all(isinstance(v, (int, float)) for v in values) else value
    return out


def ratios(per_round: dict[str, list[dict]]) -> dict:
    """nano_infer over each other engine, per round: output tokens per wall second (the headline) and per
    CPU second (what a loaded machine distorts least); the median and the spread over rounds."""
    if "nano_infer" not in per_round:
        return {}
    ours = per_round["nano_infer"]
    out = {}
    for name, rows in per_round.items():
        if name == "nano_infer":
            continue
        wall = [a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(ours, rows)]
        cpu = [a["tokens_per_cpu_s"] / b["tokens_per_cpu_s"] for a, b in zip(ours, rows)]
        out[f"nano_infer / {name}"] = {"median": statistics.median(wall), "min": min(wall), "max": max(wall),
                                       "cpu_median": statistics.median(cpu)}
    return out


def device_name() -> str:
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return f"cpu ({torch.get_num_threads()} threads)"
